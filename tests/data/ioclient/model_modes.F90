! Test model for tests/test_ioclient_modes.py (written for the test): the same run in
! every mode, the mode coming from the config's ioserver.mode.
!
! Usage: model_modes CONFIG NSTEPS
! A 24 x 12 lon/lat grid in unequal latitude bands (rank r of P gets 1 + 2r rows, the last
! rank the rest), a land mask and cell areas; per step tas(lon, lat) real(8) and
! ta(lon, lat, lev) real(4) from exact formulas of the global indices (the test's Python
! twin sends the same numbers through the Python API):
!   tas = 1000 s + 10 j + i + 0.25,  ta = 0.5 + 1000 s + 100 k + 10 j + i (0-based i, j, k)
! Built with ENSIO_USE_MPI it takes MPI from `use mpi` (a site MPI).
program model_modes
#ifdef ENSIO_USE_MPI
  use mpi
#endif
  use ensio_ioclient
  implicit none
  integer, parameter :: ni = 24, njg = 12, nk = 3
  character(len=512) :: config, arg
  integer :: world, comm, rank, nproc, nsteps, jb, nj, s, i, j, k, r, ierr
  real(8) :: lon(ni), lonb(2, ni)
  real(8), allocatable :: lat(:), latb(:, :), area(:, :), tas(:, :)
  real(4), allocatable :: ta(:, :, :)
  integer, allocatable :: mask(:, :)
  type(ensio_ioclient_report_t) :: rep

  call get_command_argument(1, config)
  call get_command_argument(2, arg)
  read (arg, *) nsteps
#ifdef ENSIO_USE_MPI
  call MPI_Init(ierr)
  world = MPI_COMM_WORLD
#else
  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
#endif
  call ensio_ioclient_init(world, "modes", comm, config=trim(config))
  call ensio_ioclient_comm_rank(comm, rank)
  call ensio_ioclient_comm_size(comm, nproc)
#ifdef ENSIO_USE_MPI
  call MPI_Barrier(comm, ierr)  ! the model communicator works with the site MPI's calls
#endif
  jb = 0
  do r = 0, rank - 1
    jb = jb + 1 + 2 * r
  end do
  nj = 1 + 2 * rank
  if (rank == nproc - 1) nj = njg - jb
  allocate(lat(nj), latb(2, nj), area(ni, nj), tas(ni, nj), ta(ni, nj, nk), mask(ni, nj))
  do i = 1, ni
    lon(i) = (i - 0.5d0) * 15d0
    lonb(:, i) = [lon(i) - 7.5d0, lon(i) + 7.5d0]
  end do
  do j = 1, nj
    lat(j) = -90d0 + (jb + j - 0.5d0) * 15d0
    latb(:, j) = [lat(j) - 7.5d0, lat(j) + 7.5d0]
    do i = 1, ni
      area(i, j) = 1d0 + (jb + j - 1)
      mask(i, j) = merge(0, 1, jb + j - 1 >= 2 .and. jb + j - 1 < 4 .and. i - 1 >= 5 &
                                .and. i - 1 < 9)
    end do
  end do
  call ensio_ioclient_set_domain("atm", 0, ni, jb, nj, lon=lon, lat=lat, lon_bounds=lonb, &
                                 lat_bounds=latb, mask=mask, area=area)
  call ensio_ioclient_close_definition()
  do s = 1, nsteps
    call ensio_ioclient_update_timestep(s)
    do j = 1, nj
      do i = 1, ni
        tas(i, j) = 1000d0 * s + 10d0 * (jb + j - 1) + (i - 1) + 0.25d0
        do k = 1, nk
          ta(i, j, k) = real(0.5d0 + 1000d0 * s + 100d0 * (k - 1) + 10d0 * (jb + j - 1) &
                             + (i - 1), 4)
        end do
      end do
    end do
    if (ensio_ioclient_is_active("tas")) call ensio_ioclient_send("tas", tas)
    if (ensio_ioclient_is_active("ta")) call ensio_ioclient_send("ta", ta)
  end do
  call ensio_ioclient_finalize(rep)
  print "(a, i0, 1x, i0)", "REPORT ", rank, rep%files_written
#ifdef ENSIO_USE_MPI
  call MPI_Finalize(ierr)
#else
  call ensio_ioclient_mpi_finalize()
#endif
end program model_modes
