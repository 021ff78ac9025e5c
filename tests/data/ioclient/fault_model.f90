! Test model for tests/test_ioserver_faults.py: a small Fortran model run MPMD against
! the real `ensio ioserver`, with the faults a modeller makes (or meets) on purpose.
! Grid ni x njg (8 x 6) in latitude bands over the model ranks; field tas(i, j) =
! step * 1000 + j_global * 10 + i (1-based i, j as in the config's test); nsteps steps.
! Usage: fault_model MODE [NSTEPS] [FLAGFILE]; MODE is
!   normal   every step sends tas (and pr when the config's table asks for it: never here)
!   badsize  model rank 1 sends tas with one value too few at step 2 (no ierr: the job ends)
!   badrange every rank declares a part of a 16-column domain (the config says 8)
!   wait     after step 1 rank 0 prints STEP1 and every rank waits until FLAGFILE exists
!            (the test stops the server meanwhile), then goes on to the end
! Every rank prints DONE <rank> when finalize returned.
program fault_model
  use ensio_ioclient
  implicit none
  integer, parameter :: ni = 8, njg = 6
  integer :: world, comm, rank, nproc, jb, nj, i, j, s, nsteps, nargs, wide
  logical :: there
  character(len=32) :: mode, arg
  character(len=512) :: flag
  real(8), allocatable :: lon(:), lat(:), tas(:, :)
  type(ensio_ioclient_report_t) :: rep

  call get_command_argument(1, mode)
  nsteps = 4
  nargs = command_argument_count()
  if (nargs >= 2) then
    call get_command_argument(2, arg)
    read (arg, *) nsteps
  end if
  flag = ""
  if (nargs >= 3) call get_command_argument(3, flag)
  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
  call ensio_ioclient_init(world, "fault", comm)
  call ensio_ioclient_comm_rank(comm, rank)
  call ensio_ioclient_comm_size(comm, nproc)
  jb = rank * njg / nproc
  nj = (rank + 1) * njg / nproc - jb
  wide = merge(2 * ni, ni, mode == "badrange")
  allocate(lon(wide), lat(nj), tas(wide, nj))
  do i = 1, wide
    lon(i) = (i - 1) * 45d0
  end do
  do j = 1, nj
    lat(j) = -75d0 + (jb + j - 1) * 30d0
  end do
  call ensio_ioclient_set_domain("atm", 0, wide, jb, nj, lon=lon, lat=lat)
  call ensio_ioclient_close_definition()
  do s = 1, nsteps
    call ensio_ioclient_update_timestep(s)
    do j = 1, nj
      do i = 1, wide
        tas(i, j) = s * 1000d0 + (jb + j) * 10d0 + i
      end do
    end do
    if (mode == "badsize" .and. rank == 1 .and. s == 2) then
      call ensio_ioclient_send("tas", tas(1:wide - 1, 1))
    else
      call ensio_ioclient_send("tas", tas)
    end if
    if (mode == "wait" .and. s == 1) then
      if (rank == 0) print "(a)", "STEP1"
      flush (6)
      there = .false.
      do while (.not. there)
        inquire (file=trim(flag), exist=there)
      end do
    end if
  end do
  call ensio_ioclient_finalize(rep)
  print "(a, i0)", "DONE ", rank
  call ensio_ioclient_mpi_finalize()
end program fault_model
