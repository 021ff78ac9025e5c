! Test model for tests/test_ioserver_cclient.py: the Fortran twin of model_c.c (same
! grid, decomposition, steps and formula; see there), through the module ensio_ioclient.
! Fortran order: tas(ni, nj), ta(ni, nj, nk) are C (nj, ni), (nk, nj, ni). tas lives in
! an array with halos, as in a model: its interior is a non-contiguous section.
program model_f
  use ensio_ioclient
  implicit none
  integer, parameter :: ni = 8, njg = 6, nk = 3, nc = 10, oi = 4, oj = 3, nsteps = 4
  integer :: world, comm, rank, wrank, nproc, jb, nj, ib, ncl, ob, no, s, i, j, k, ierr
  real(8), allocatable :: olon(:, :), olat(:, :), olonb(:, :, :), olatb(:, :, :), oarea(:, :)
  real(8), allocatable :: sst(:, :)
  real(8), allocatable :: lon(:), lat(:), lonb(:, :), latb(:, :), area(:, :), tas(:, :)
  real(8), allocatable :: halo(:, :)
  real(8), allocatable :: clon(:), clat(:), clonb(:, :), clatb(:, :), cu(:)
  real(4), allocatable :: ta(:, :, :)
  integer, allocatable :: mask(:, :)
  type(ensio_ioclient_report_t) :: rep

  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
  call ensio_ioclient_comm_rank(world, wrank)
  call ensio_ioclient_init(world, "test", comm)
  call ensio_ioclient_comm_rank(comm, rank)
  call ensio_ioclient_comm_size(comm, nproc)
  jb = rank * njg / nproc
  nj = (rank + 1) * njg / nproc - jb
  ib = rank * nc / nproc
  ncl = (rank + 1) * nc / nproc - ib
  allocate(lon(ni), lat(nj), lonb(2, ni), latb(2, nj), area(ni, nj), mask(ni, nj))
  allocate(tas(ni, nj), ta(ni, nj, nk), clon(ncl), clat(ncl), clonb(3, ncl), clatb(3, ncl))
  ob = rank * oi / nproc
  no = (rank + 1) * oi / nproc - ob
  allocate(olon(no, oj), olat(no, oj), olonb(4, no, oj), olatb(4, no, oj), oarea(no, oj))
  allocate(sst(no, oj))
  do j = 1, oj
    do i = 1, no
      olon(i, j) = 10d0 * (ob + i - 1) + (j - 1)
      olat(i, j) = 20d0 * (j - 1) - (ob + i - 1)
      oarea(i, j) = 100d0 + (ob + i - 1) + (j - 1)
      olonb(:, i, j) = olon(i, j) + [-0.5d0, 0.5d0, 0.5d0, -0.5d0]
      olatb(:, i, j) = olat(i, j) + [-0.5d0, -0.5d0, 0.5d0, 0.5d0]
    end do
  end do
  allocate(cu(ncl), halo(0:ni + 1, 0:nj + 1))
  halo = -999d0
  do i = 1, ni
    lon(i) = (i - 1) * 45d0
    lonb(:, i) = [lon(i) - 22.5d0, lon(i) + 22.5d0]
  end do
  do j = 1, nj
    lat(j) = -75d0 + (jb + j - 1) * 30d0
    latb(:, j) = [lat(j) - 15d0, lat(j) + 15d0]
    do i = 1, ni
      mask(i, j) = merge(1, 0, mod(i - 1 + jb + j - 1, 5) /= 0)
      area(i, j) = 1d0 + (i - 1) + 10d0 * (jb + j - 1)
    end do
  end do
  do i = 1, ncl
    clon(i) = (ib + i - 1) * 36d0
    clat(i) = 0.5d0 * (ib + i - 1) - 2d0
    clonb(:, i) = clon(i) + [-1d0, 0d0, 1d0]
    clatb(:, i) = clat(i) + [-1d0, 1d0, -1d0]
  end do
  call ensio_ioclient_set_domain("ocn", ob, no, 0, oj, lon=olon, lat=olat, lon_bounds=olonb, &
                                 lat_bounds=olatb, area=oarea)
  call ensio_ioclient_set_domain("atm", 0, ni, jb, nj, lon=lon, lat=lat, lon_bounds=lonb, &
                                 lat_bounds=latb, mask=mask, area=area)
  call ensio_ioclient_set_domain("cells", ib, ncl, 0, 1, lon=clon, lat=clat, lon_bounds=clonb, &
                                 lat_bounds=clatb)
  call ensio_ioclient_close_definition()
  do s = 1, nsteps
    call ensio_ioclient_update_timestep(s)
    do j = 1, nj
      do i = 1, ni
        tas(i, j) = s * 1000d0 + (jb + j - 1) * 10d0 + (i - 1) + 0.25d0
        do k = 1, nk
          ta(i, j, k) = real(0.5d0 + s * 1000d0 + (k - 1) * 100d0 + (jb + j - 1) * 10d0 &
                             + (i - 1) + 0.25d0, 4)
        end do
      end do
    end do
    do i = 1, ncl
      cu(i) = s * 1000d0 + (ib + i - 1) + 0.75d0
    end do
    if (s == 1) then
      call ensio_ioclient_send("nosuch", tas, ierr)
      if (ierr /= 0) print "(a)", "ERR unknown: " // ensio_ioclient_errmsg()
    end if
    do j = 1, oj
      do i = 1, no
        sst(i, j) = s * 1000d0 + (j - 1) * 10d0 + (ob + i - 1) + 0.125d0
      end do
    end do
    call ensio_ioclient_send("sst", sst)
    halo(1:ni, 1:nj) = tas
    call ensio_ioclient_send("tas", halo(1:ni, 1:nj))
    if (ensio_ioclient_is_active("ta")) call ensio_ioclient_send("ta", ta)
    if (ensio_ioclient_is_active("cu", s)) call ensio_ioclient_send("cu", cu)
  end do
  call ensio_ioclient_finalize(rep)
  print "(a, i0, 1x, i0, 1x, f0.6, 3(1x, i0), 1x, f0.9)", "REPORT ", wrank, rep%bytes_sent, &
      rep%server_busy_fraction, rep%server_memory_hwm_bytes, rep%bytes_written, &
      rep%files_written, rep%blocked_seconds
  call ensio_ioclient_mpi_finalize()
end program model_f
