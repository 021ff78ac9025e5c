! A model written against XIOS, structured as XIOS's own test clients are (written for
! tests/test_ioserver_iodef_fortran.py): xios_initialize -> context -> calendar ->
! domain/axis attributes -> close_context_definition -> update_calendar/send_field per
! step -> context_finalize -> finalize.  It uses only the xios module (plus MPI's rank
! and size), and its output is defined by iodef.xml.  The fields live in arrays with a
! one-point halo (data_ibegin = data_jbegin = -1) filled with -999, as in a model.
! Grid: 24 x 12 cells of 15 degrees, latitude bands over the model ranks; 16 steps of 3 h.
program model_xios
  use xios
  use, intrinsic :: iso_c_binding
  implicit none
  interface  ! MPI's C functions (the mpich wheel has no Fortran bindings; handles are ints)
    integer(c_int) function mpi_comm_rank_c(comm, rank) bind(c, name="MPI_Comm_rank")
      import :: c_int
      integer(c_int), value :: comm
      integer(c_int), intent(out) :: rank
    end function
    integer(c_int) function mpi_comm_size_c(comm, size) bind(c, name="MPI_Comm_size")
      import :: c_int
      integer(c_int), value :: comm
      integer(c_int), intent(out) :: size
    end function
  end interface
  integer, parameter :: ni_glo = 24, nj_glo = 12, nk = 3, nsteps = 16, h = 1
  real(8), parameter :: pi = 3.14159265358979323846d0
  type(xios_duration) :: dtime
  type(xios_context) :: ctx_hdl
  integer :: comm, ts, i, j, k, jbegin, nj
  integer(c_int) :: rank, nproc
  real(8), allocatable :: lon(:), lat(:), lonb(:, :), latb(:, :)
  real(8), allocatable :: tas(:, :), pr(:, :), ta(:, :, :)

  call xios_initialize("client", return_comm=comm)
  if (mpi_comm_rank_c(int(comm, c_int), rank) /= 0) error stop "MPI_Comm_rank"
  if (mpi_comm_size_c(int(comm, c_int), nproc) /= 0) error stop "MPI_Comm_size"
  jbegin = rank * nj_glo / nproc
  nj = (rank + 1) * nj_glo / nproc - jbegin

  call xios_context_initialize("test", comm)
  call xios_get_handle("test", ctx_hdl)
  call xios_set_current_context(ctx_hdl)

  dtime%second = 10800
  call xios_define_calendar(type="NoLeap", timestep=dtime, &
                            start_date=xios_date(2001, 2, 27, 0, 0, 0), &
                            time_origin=xios_date(2001, 2, 27, 0, 0, 0))

  allocate(lon(ni_glo), lat(nj), lonb(2, ni_glo), latb(2, nj))
  do i = 1, ni_glo
    lon(i) = 7.5d0 + 15d0 * (i - 1)
    lonb(:, i) = lon(i) + [-7.5d0, 7.5d0]
  end do
  do j = 1, nj
    lat(j) = -82.5d0 + 15d0 * (jbegin + j - 1)
    latb(:, j) = lat(j) + [-7.5d0, 7.5d0]
  end do
  call xios_set_domain_attr("atm", ni_glo=ni_glo, nj_glo=nj_glo, type="rectilinear")
  call xios_set_domain_attr("atm", ibegin=0, ni=ni_glo, jbegin=jbegin, nj=nj)
  call xios_set_domain_attr("atm", data_dim=2, data_ibegin=-h, data_ni=ni_glo + 2 * h, &
                            data_jbegin=-h, data_nj=nj + 2 * h)
  call xios_set_domain_attr("atm", lonvalue_1d=lon, latvalue_1d=lat, bounds_lon_1d=lonb, &
                            bounds_lat_1d=latb)
  call xios_set_axis_attr("lev", n_glo=nk, value=[1d0, 2d0, 3d0])
  ! the error test: a run-time attribute change ensio cannot honour stops the job
  call get_environment_variable("XIOS_TEST_SET_FIELD_ATTR", length=i)
  if (i > 0) call xios_set_field_attr("tas", enabled=.false.)
  call xios_close_context_definition()

  allocate(tas(1 - h:ni_glo + h, 1 - h:nj + h), pr(1 - h:ni_glo + h, 1 - h:nj + h))
  allocate(ta(1 - h:ni_glo + h, 1 - h:nj + h, nk))
  do ts = 1, nsteps
    call xios_update_calendar(ts)
    tas = -999d0
    pr = -999d0
    ta = -999d0
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
    call xios_send_field("tas", tas)
    call xios_send_field("pr", pr)
    if (xios_field_is_active("ta", .true.)) call xios_send_field("ta", ta)
  end do

  call xios_context_finalize()
  call xios_finalize()
end program model_xios
