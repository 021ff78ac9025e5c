! Test model for tests/test_ioserver_faultfiles_mpmd.py: a small Fortran model run MPMD
! against the real `ensio ioserver`, whose output files must stay consistent when a
! process of the job dies. Grid ni x njg (8 x 6) in latitude bands over the model
! ranks; field tas(i, j) = step * 1000 + j_global * 10 + i (1-based), nsteps steps.
! Usage: faultfiles_model NSTEPS [KILLSTEP [WAITFILE]]: with KILLSTEP, model rank 1 sends
! step KILLSTEP, waits until WAITFILE exists (the server is writing: the test passes the
! staging file of one output) and then SIGKILLs itself (GNU kill/getpid).
! Every rank prints DONE <rank> when finalize returned.
program faultfiles_model
  use ensio_ioclient
  implicit none
  integer, parameter :: ni = 8, njg = 6
  integer :: world, comm, rank, nproc, jb, nj, i, j, s, nsteps, killstep, ierr
  character(len=32) :: arg
  character(len=512) :: waitfile
  logical :: there
  real(8), allocatable :: lon(:), lat(:), tas(:, :)
  type(ensio_ioclient_report_t) :: rep

  call get_command_argument(1, arg)
  read (arg, *) nsteps
  killstep = -1
  if (command_argument_count() >= 2) then
    call get_command_argument(2, arg)
    read (arg, *) killstep
  end if
  waitfile = ""
  if (command_argument_count() >= 3) call get_command_argument(3, waitfile)
  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
  call ensio_ioclient_init(world, "faultfiles", comm)
  call ensio_ioclient_comm_rank(comm, rank)
  call ensio_ioclient_comm_size(comm, nproc)
  jb = rank * njg / nproc
  nj = (rank + 1) * njg / nproc - jb
  allocate(lon(ni), lat(nj), tas(ni, nj))
  do i = 1, ni
    lon(i) = (i - 1) * 45d0
  end do
  do j = 1, nj
    lat(j) = -75d0 + (jb + j - 1) * 30d0
  end do
  call ensio_ioclient_set_domain("atm", 0, ni, jb, nj, lon=lon, lat=lat)
  call ensio_ioclient_close_definition()
  do s = 1, nsteps
    call ensio_ioclient_update_timestep(s)
    do j = 1, nj
      do i = 1, ni
        tas(i, j) = s * 1000d0 + (jb + j) * 10d0 + i
      end do
    end do
    call ensio_ioclient_send("tas", tas)
    if (s == killstep .and. rank == 1) then
      there = len_trim(waitfile) == 0
      do while (.not. there)
        inquire (file=trim(waitfile), exist=there)
      end do
      flush (6)
      ierr = kill(getpid(), 9)
    end if
  end do
  call ensio_ioclient_finalize(rep)
  print "(a, i0)", "DONE ", rank
  call ensio_ioclient_mpi_finalize()
end program faultfiles_model
