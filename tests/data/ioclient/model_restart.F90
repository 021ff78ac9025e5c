! Restart test model for tests/test_ioclient_restart.py (written for the test).
!
! Usage: model_restart CONFIG SPLIT INPUT TEMPLATE OUTPUT
! Every model rank reads its box of INPUT (read_restart), then writes it to OUTPUT
! (write_restart: a copy of TEMPLATE with the variables replaced).  SPLIT says how the
! (lon, lat[, lev]) arrays are decomposed: "lat" = latitude bands, "lon" = longitude
! bands, so a file written by P ranks in one decomposition is read by Q ranks in another.
! Variables (Fortran order, the file's netCDF dimensions reversed): state(lon, lat, lev)
! real(8), sst(lon, lat) real(4), kind(lon, lat) integer(4).  Ends with "DONE rank".
! Built with ENSIO_USE_MPI defined it takes MPI from `use mpi` (a site MPI), with
! ENSIO_USE_MPI_F08 from `use mpi_f08`, else from the module's helpers (a pip MPICH
! without Fortran bindings).
program model_restart
#if defined(ENSIO_USE_MPI_F08)
  use mpi_f08
#elif defined(ENSIO_USE_MPI)
  use mpi
#endif
  use ensio_ioclient
  implicit none
  integer, parameter :: nlon = 16, nlat = 11, nlev = 3
  character(len=512) :: config, split, input, template, output
  integer :: world, comm, rank, nproc, i0, ni, j0, nj, ierr
  real(8), allocatable :: state(:, :, :)
  real(4), allocatable :: sst(:, :)
  integer(4), allocatable :: kind2(:, :)

  call get_command_argument(1, config)
  call get_command_argument(2, split)
  call get_command_argument(3, input)
  call get_command_argument(4, template)
  call get_command_argument(5, output)
#if defined(ENSIO_USE_MPI_F08)
  call MPI_Init(ierr)
  world = MPI_COMM_WORLD%MPI_VAL  ! the integer handle the module takes
#elif defined(ENSIO_USE_MPI)
  call MPI_Init(ierr)
  world = MPI_COMM_WORLD
#else
  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
#endif
  call ensio_ioclient_init(world, "restart", comm, config=trim(config))
  call ensio_ioclient_comm_rank(comm, rank)
  call ensio_ioclient_comm_size(comm, nproc)
  i0 = 0
  ni = nlon
  j0 = 0
  nj = nlat
  if (trim(split) == "lat") then
    j0 = rank * nlat / nproc
    nj = (rank + 1) * nlat / nproc - j0
  else
    i0 = rank * nlon / nproc
    ni = (rank + 1) * nlon / nproc - i0
  end if
  allocate(state(ni, nj, nlev), sst(ni, nj), kind2(ni, nj))
  call ensio_ioclient_read_restart(trim(input), "state", [i0, j0, 0], state)
  call ensio_ioclient_read_restart(trim(input), "sst", [i0, j0], sst)
  call ensio_ioclient_read_restart(trim(input), "kind", [i0, j0], kind2)
  call ensio_ioclient_restart_begin(trim(output), trim(template))
  call ensio_ioclient_restart_put("state", [i0, j0, 0], state)
  call ensio_ioclient_restart_put("sst", [i0, j0], sst)
  call ensio_ioclient_restart_put("kind", [i0, j0], kind2)
  call ensio_ioclient_write_restart()
  call ensio_ioclient_finalize()
  print "(a, i0)", "DONE ", rank
#if defined(ENSIO_USE_MPI) || defined(ENSIO_USE_MPI_F08)
  call MPI_Finalize(ierr)
#else
  call ensio_ioclient_mpi_finalize()
#endif
end program model_restart
