! The model of model_xios.f90 (same grid, decomposition, steps and formula) through the
! native ensio Fortran module and iodef_native.yaml (tests/test_ioserver_iodef_fortran.py):
! the files of the two must be equal.
program model_native
  use ensio_ioclient
  implicit none
  integer, parameter :: ni_glo = 24, nj_glo = 12, nk = 3, nsteps = 16
  real(8), parameter :: pi = 3.14159265358979323846d0
  integer :: world, comm, rank, nproc, ts, i, j, k, jbegin, nj
  real(8), allocatable :: lon(:), lat(:), lonb(:, :), latb(:, :)
  real(8), allocatable :: tas(:, :), pr(:, :), ta(:, :, :)

  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
  call ensio_ioclient_init(world, "test", comm)
  call ensio_ioclient_comm_rank(comm, rank)
  call ensio_ioclient_comm_size(comm, nproc)
  jbegin = rank * nj_glo / nproc
  nj = (rank + 1) * nj_glo / nproc - jbegin
  allocate(lon(ni_glo), lat(nj), lonb(2, ni_glo), latb(2, nj))
  do i = 1, ni_glo
    lon(i) = 7.5d0 + 15d0 * (i - 1)
    lonb(:, i) = lon(i) + [-7.5d0, 7.5d0]
  end do
  do j = 1, nj
    lat(j) = -82.5d0 + 15d0 * (jbegin + j - 1)
    latb(:, j) = lat(j) + [-7.5d0, 7.5d0]
  end do
  ! positional: lon, lat, then the bounds
  call ensio_ioclient_set_domain("atm", 0, ni_glo, jbegin, nj, lon, lat, lonb, latb)
  call ensio_ioclient_close_definition()
  allocate(tas(ni_glo, nj), pr(ni_glo, nj), ta(ni_glo, nj, nk))
  do ts = 1, nsteps
    call ensio_ioclient_update_timestep(ts)
    do j = 1, nj
      do i = 1, ni_glo
        tas(i, j) = 260d0 + 30d0 * cos(lat(j) * pi / 180d0) &
                    + 5d0 * sin(lon(i) * pi / 180d0 + 2d0 * pi * ts / 8d0)
        pr(i, j) = 1d-5 * (2d0 + sin(lat(j) * pi / 180d0) * cos(2d0 * pi * ts / 8d0))
        do k = 1, nk
          ta(i, j, k) = tas(i, j) - 6.5d0 * k
        end do
      end do
    end do
    call ensio_ioclient_send("tas", tas)
    call ensio_ioclient_send("pr", pr)
    if (ensio_ioclient_is_active("ta")) call ensio_ioclient_send("ta", ta)
  end do
  call ensio_ioclient_finalize()
  call ensio_ioclient_mpi_finalize()
end program model_native
