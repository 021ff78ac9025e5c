! xios.f90 -- XIOS's Fortran interface (module xios) over the ensio I/O server client.
!
! A model written against XIOS relinks against ensio with no source change: the
! routine names, their argument names and their conventions are XIOS's, and the
! output is defined by the model's iodef.xml, which `ensio ioserver iodef.xml` reads
! (mpiexec -n P ./model : -n S ensio ioserver iodef.xml).  Build: ensio ioclient
! build --prefix DIR installs DIR/include/xios.mod and DIR/lib/libxios.{so,a}; link
! the model with -I DIR/include -L DIR/lib -lxios -lensio_ioclient (and MPI).
!
! How the XIOS calls map onto the C client (ensio_ioclient.h):
!   xios_initialize(client_id, return_comm=c) -> ensio_ioclient_init over
!     MPI_COMM_WORLD (MPI_Init first if the model has not called it); c is the model
!     ranks' communicator.
!   xios_context_initialize / xios_get_handle / xios_set_current_context: one context.
!   xios_set_domain_attr: collected (any number of calls, any order) and declared to
!     the servers by xios_close_context_definition: ibegin/jbegin are 0-based as in
!     XIOS 2; lonvalue_1d/latvalue_1d (rectilinear: ni and nj values; curvilinear and
!     unstructured: one per point), lonvalue_2d/latvalue_2d, bounds_lon_1d/_2d,
!     bounds_lat_1d/_2d, mask_1d/mask_2d (logical), area.  data_dim=2 with data_ibegin,
!     data_ni, data_jbegin, data_nj (a halo) makes xios_send_field drop the halo of an
!     array shaped (data_ni, data_nj[, nk]).
!   xios_update_calendar(step) -> update_timestep(step) (steps are 1-based in both).
!   xios_send_field(id, field) -> send (real(4)/real(8), rank 1..3, Fortran order
!     (ni, nj[, nk]) = the C (nk, nj, ni) the protocol sends).
!   xios_field_is_active(id[, at_current_timestep_arg]) -> is_active.
!   xios_context_finalize -> finalize; xios_finalize -> MPI_Finalize if
!     xios_initialize started MPI.
! What the iodef.xml decides is not sent at run time: the calendar, the global
! sizes (ni_glo, nj_glo, n_glo), axis values and every field/file attribute are the
! servers' (from the XML).  xios_define_calendar, xios_set_timestep,
! xios_set_start_date, xios_set_time_origin and xios_set_axis_attr are accepted (the
! values stay in the XML); xios_set_field_attr / xios_set_file_attr, which would
! change the output after the servers planned it, stop with a one-line error saying
! to set the attribute in the iodef.xml.
!
! Errors: one line on stderr naming the call ("xios (ensio): xios_send_field(tas):
! ..."), the servers are told (they close the files valid and end the job), and the
! program stops, as XIOS stops on an error.
module xios
  use, intrinsic :: iso_c_binding
  use ensio_ioclient_c, only: c_init, c_set_domain, c_close_definition, c_update_timestep, &
    c_send_double, c_send_float, c_is_active, c_finalize, c_abort, c_errmsg, c_strlen, &
    c_mpi_init, c_mpi_finalize, c_mpi_initialized, c_comm_world, cstr, last_error, &
    report_t => ensio_ioclient_report_t
  use, intrinsic :: iso_fortran_env, only: error_unit
  implicit none
  private

  integer, parameter :: idlen = 64

  type, public :: xios_duration
    real(8) :: year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, timestep = 0
  end type

  type, public :: xios_date
    integer :: year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0
  end type

  type, public :: xios_context
    integer(c_intptr_t) :: daddr = 0
  end type

  type(xios_duration), parameter, public :: &
    xios_year = xios_duration(1, 0, 0, 0, 0, 0, 0), xios_month = xios_duration(0, 1, 0, 0, 0, 0, 0), &
    xios_day = xios_duration(0, 0, 1, 0, 0, 0, 0), xios_hour = xios_duration(0, 0, 0, 1, 0, 0, 0), &
    xios_minute = xios_duration(0, 0, 0, 0, 1, 0, 0), &
    xios_second = xios_duration(0, 0, 0, 0, 0, 1, 0), &
    xios_timestep = xios_duration(0, 0, 0, 0, 0, 0, 1)

  !> One domain's attributes as the model set them (flat arrays in Fortran order).
  type :: domain_t
    character(len=idlen) :: id = ""
    character(len=16) :: dtype = ""
    integer :: ibegin = -1, ni = -1, jbegin = -1, nj = -1
    integer :: data_dim = -1, data_ibegin = 0, data_ni = -1, data_jbegin = 0, data_nj = -1
    real(c_double), allocatable :: lon(:), lat(:), lonb(:), latb(:), area(:)
    integer(c_int), allocatable :: mask(:)
  end type

  type(domain_t), allocatable, target, save :: doms(:)
  integer, save :: ndom = 0
  logical, save :: started_mpi = .false., initialized = .false., closed = .false.
  character(len=idlen), save :: current_ctx = ""

  public :: xios_initialize, xios_finalize, xios_context_initialize, xios_context_finalize
  public :: xios_get_handle, xios_set_current_context, xios_close_context_definition
  public :: xios_solve_inheritance
  public :: xios_define_calendar, xios_set_timestep, xios_set_start_date, xios_set_time_origin
  public :: xios_set_domain_attr, xios_set_axis_attr, xios_set_field_attr, xios_set_file_attr
  public :: xios_update_calendar, xios_send_field, xios_field_is_active
  public :: operator(*), operator(+)

  interface xios_send_field
    module procedure send_d1, send_d2, send_d3, send_f1, send_f2, send_f3
  end interface

  interface operator(*)
    module procedure real_times_duration, int_times_duration
  end interface

  interface operator(+)
    module procedure duration_plus_duration
  end interface

contains

  ! --- helpers ------------------------------------------------------------------------

  !> One line naming the call, the servers told (they close the files), then stop.
  subroutine fail(where, why)
    character(len=*), intent(in) :: where, why
    integer(c_int) :: rc
    write(error_unit, '(a)') "xios (ensio): " // where // ": " // why
    if (initialized) rc = c_abort(cstr(where // ": " // why))
    error stop 2
  end subroutine

  subroutine check(rc, where)
    integer(c_int), intent(in) :: rc
    character(len=*), intent(in) :: where
    if (rc /= 0) call fail(where, last_error())
  end subroutine

  subroutine need_init(where)
    character(len=*), intent(in) :: where
    if (.not. initialized) call fail(where, "call xios_initialize first")
  end subroutine

  function domain_index(id) result(k)
    character(len=*), intent(in) :: id
    integer :: k
    type(domain_t), allocatable :: grown(:)
    do k = 1, ndom
      if (doms(k)%id == id) return
    end do
    if (.not. allocated(doms)) allocate(doms(4))
    if (ndom == size(doms)) then
      allocate(grown(2 * ndom))
      grown(1:ndom) = doms(1:ndom)
      call move_alloc(grown, doms)
    end if
    ndom = ndom + 1
    k = ndom
    doms(k)%id = id
  end function

  subroutine keep(dst, src)
    real(c_double), allocatable, intent(inout) :: dst(:)
    real(8), intent(in) :: src(:)
    dst = real(src, c_double)
  end subroutine

  function ptr_d(a) result(p)
    real(c_double), allocatable, target, intent(in) :: a(:)
    type(c_ptr) :: p
    p = c_null_ptr
    if (allocated(a)) p = c_loc(a)
  end function

  ! --- initialisation and contexts --------------------------------------------------

  subroutine xios_initialize(client_id, local_comm, return_comm)
    character(len=*), intent(in) :: client_id
    integer, intent(in), optional :: local_comm
    integer, intent(out), optional :: return_comm
    integer(c_int) :: flag, model
    if (present(local_comm)) call fail("xios_initialize", &
        "local_comm is not supported: ensio's client starts over MPI_COMM_WORLD")
    flag = 0
    if (c_mpi_initialized(flag) /= 0) call fail("xios_initialize", "MPI_Initialized failed")
    if (flag == 0) then
      if (c_mpi_init() /= 0) call fail("xios_initialize", "MPI_Init failed")
      started_mpi = .true.
    end if
    model = 0
    call check(c_init(c_comm_world(), cstr(client_id), model), "xios_initialize")
    initialized = .true.
    if (present(return_comm)) return_comm = int(model)
  end subroutine

  !> comm: the model communicator xios_initialize returned (nothing to do with it here).
  subroutine xios_context_initialize(context_id, comm)
    character(len=*), intent(in) :: context_id
    integer, intent(in) :: comm
    call need_init("xios_context_initialize")
    if (len_trim(context_id) == 0) call fail("xios_context_initialize", "empty context id")
    if (len_trim(current_ctx) > 0) call fail("xios_context_initialize(" // trim(context_id) &
        // ")", "ensio serves one context per run (already " // trim(current_ctx) // ")")
    current_ctx = context_id
    if (comm == -huge(comm)) continue
  end subroutine

  subroutine xios_get_handle(idt, ret)
    character(len=*), intent(in) :: idt
    type(xios_context), intent(out) :: ret
    if (trim(idt) /= trim(current_ctx)) call fail("xios_get_handle(" // trim(idt) // ")", &
        "no such context (xios_context_initialize it first)")
    ret%daddr = 1
  end subroutine

  subroutine xios_set_current_context(context, withswap)
    type(xios_context), intent(in) :: context
    logical, intent(in), optional :: withswap
    if (context%daddr /= 1) call fail("xios_set_current_context", "not a context handle")
    if (present(withswap)) continue
  end subroutine

  subroutine xios_solve_inheritance()
  end subroutine

  ! --- calendar: the iodef.xml's <calendar> rules -------------------------------------

  subroutine xios_define_calendar(type, timestep, start_date, time_origin, day_length, &
                                  month_lengths, year_length, leap_year_month, &
                                  leap_year_drift, leap_year_drift_offset)
    character(len=*), intent(in) :: type
    type(xios_duration), intent(in), optional :: timestep
    type(xios_date), intent(in), optional :: start_date, time_origin
    integer, intent(in), optional :: day_length, month_lengths(:), year_length, leap_year_month
    real(8), intent(in), optional :: leap_year_drift, leap_year_drift_offset
    call need_init("xios_define_calendar")
    if (present(day_length) .or. present(month_lengths) .or. present(year_length) .or. &
        present(leap_year_month) .or. present(leap_year_drift) .or. &
        present(leap_year_drift_offset)) &
      call fail("xios_define_calendar(" // trim(type) // ")", &
                "user-defined calendars are not supported")
    if (present(timestep) .or. present(start_date) .or. present(time_origin)) continue
  end subroutine

  subroutine xios_set_timestep(timestep)
    type(xios_duration), intent(in) :: timestep
    if (timestep%second < 0) call fail("xios_set_timestep", "negative time step")
  end subroutine

  subroutine xios_set_start_date(start_date)
    type(xios_date), intent(in) :: start_date
    if (start_date%month < 0) call fail("xios_set_start_date", "bad date")
  end subroutine

  subroutine xios_set_time_origin(time_origin)
    type(xios_date), intent(in) :: time_origin
    if (time_origin%month < 0) call fail("xios_set_time_origin", "bad date")
  end subroutine

  ! --- domains and axes ------------------------------------------------------------------

  !> XIOS's argument names; see the header for what is used.
  subroutine xios_set_domain_attr(domain_id, area, bounds_lat_1d, bounds_lat_2d, &
      bounds_lon_1d, bounds_lon_2d, data_dim, data_ibegin, data_jbegin, data_ni, data_nj, &
      i_index, ibegin, j_index, jbegin, latvalue_1d, latvalue_2d, long_name, lonvalue_1d, &
      lonvalue_2d, mask_1d, mask_2d, name, ni, ni_glo, nj, nj_glo, nvertex, standard_name, &
      type)
    character(len=*), intent(in) :: domain_id
    real(8), intent(in), optional :: area(:, :), bounds_lat_1d(:, :), bounds_lat_2d(:, :, :)
    real(8), intent(in), optional :: bounds_lon_1d(:, :), bounds_lon_2d(:, :, :)
    integer, intent(in), optional :: data_dim, data_ibegin, data_jbegin, data_ni, data_nj
    integer, intent(in), optional :: i_index(:), j_index(:), ibegin, jbegin, ni, nj
    integer, intent(in), optional :: ni_glo, nj_glo, nvertex
    real(8), intent(in), optional :: latvalue_1d(:), latvalue_2d(:, :)
    real(8), intent(in), optional :: lonvalue_1d(:), lonvalue_2d(:, :)
    logical, intent(in), optional :: mask_1d(:), mask_2d(:, :)
    character(len=*), intent(in), optional :: long_name, name, standard_name, type
    integer :: k
    character(len=:), allocatable :: me
    me = "xios_set_domain_attr(" // trim(domain_id) // ")"
    call need_init(me)
    if (closed) call fail(me, "the context definition is closed")
    if (present(i_index) .or. present(j_index)) call fail(me, &
        "i_index/j_index are not supported: give ibegin, ni, jbegin, nj")
    k = domain_index(trim(domain_id))
    if (present(type)) doms(k)%dtype = type
    if (present(ibegin)) doms(k)%ibegin = ibegin
    if (present(jbegin)) doms(k)%jbegin = jbegin
    if (present(ni)) doms(k)%ni = ni
    if (present(nj)) doms(k)%nj = nj
    if (present(data_dim)) doms(k)%data_dim = data_dim
    if (present(data_ibegin)) doms(k)%data_ibegin = data_ibegin
    if (present(data_jbegin)) doms(k)%data_jbegin = data_jbegin
    if (present(data_ni)) doms(k)%data_ni = data_ni
    if (present(data_nj)) doms(k)%data_nj = data_nj
    if (present(lonvalue_1d)) call keep(doms(k)%lon, lonvalue_1d)
    if (present(latvalue_1d)) call keep(doms(k)%lat, latvalue_1d)
    if (present(lonvalue_2d)) call keep(doms(k)%lon, reshape(lonvalue_2d, [size(lonvalue_2d)]))
    if (present(latvalue_2d)) call keep(doms(k)%lat, reshape(latvalue_2d, [size(latvalue_2d)]))
    if (present(bounds_lon_1d)) call keep(doms(k)%lonb, reshape(bounds_lon_1d, [size(bounds_lon_1d)]))
    if (present(bounds_lat_1d)) call keep(doms(k)%latb, reshape(bounds_lat_1d, [size(bounds_lat_1d)]))
    if (present(bounds_lon_2d)) call keep(doms(k)%lonb, reshape(bounds_lon_2d, [size(bounds_lon_2d)]))
    if (present(bounds_lat_2d)) call keep(doms(k)%latb, reshape(bounds_lat_2d, [size(bounds_lat_2d)]))
    if (present(area)) call keep(doms(k)%area, reshape(area, [size(area)]))
    if (present(mask_1d)) doms(k)%mask = merge(1_c_int, 0_c_int, mask_1d)
    if (present(mask_2d)) doms(k)%mask = merge(1_c_int, 0_c_int, reshape(mask_2d, [size(mask_2d)]))
    ! the global sizes, the vertex count and the names are the iodef.xml's
    if (present(ni_glo) .or. present(nj_glo) .or. present(nvertex) .or. present(name) .or. &
        present(long_name) .or. present(standard_name)) continue
  end subroutine

  !> Accepted: an axis's size, values and names are the iodef.xml's (levels are never
  !> split over the model ranks in ensio).
  subroutine xios_set_axis_attr(axis_id, begin, bounds, long_name, n, n_glo, name, positive, &
                                standard_name, unit, value)
    character(len=*), intent(in) :: axis_id
    integer, intent(in), optional :: begin, n, n_glo
    real(8), intent(in), optional :: bounds(:, :), value(:)
    character(len=*), intent(in), optional :: long_name, name, positive, standard_name, unit
    character(len=:), allocatable :: me
    me = "xios_set_axis_attr(" // trim(axis_id) // ")"
    call need_init(me)
    if (present(begin) .and. present(n) .and. present(n_glo)) then
      if (begin /= 0 .or. n /= n_glo) call fail(me, &
          "ensio never splits levels over ranks: begin=0 and n=n_glo on every rank")
    end if
    if (present(bounds) .or. present(value) .or. present(long_name) .or. present(name) .or. &
        present(positive) .or. present(standard_name) .or. present(unit)) continue
  end subroutine

  subroutine xios_set_field_attr(field_id, enabled, name, operation, freq_op, long_name, &
                                 standard_name, unit)
    character(len=*), intent(in) :: field_id
    logical, intent(in), optional :: enabled
    character(len=*), intent(in), optional :: name, operation, freq_op, long_name, &
                                              standard_name, unit
    if (present(enabled) .or. present(name) .or. present(operation) .or. present(freq_op) &
        .or. present(long_name) .or. present(standard_name) .or. present(unit)) continue
    call fail("xios_set_field_attr(" // trim(field_id) // ")", "ensio's servers read the " &
              // "field attributes from the iodef.xml before the model starts: set them there")
  end subroutine

  subroutine xios_set_file_attr(file_id, enabled, name, output_freq, split_freq)
    character(len=*), intent(in) :: file_id
    logical, intent(in), optional :: enabled
    character(len=*), intent(in), optional :: name
    type(xios_duration), intent(in), optional :: output_freq, split_freq
    if (present(enabled) .or. present(name) .or. present(output_freq) .or. &
        present(split_freq)) continue
    call fail("xios_set_file_attr(" // trim(file_id) // ")", "ensio's servers read the " &
              // "file attributes from the iodef.xml before the model starts: set them there")
  end subroutine

  !> Declare every domain the model described, then end the definition phase.
  subroutine xios_close_context_definition()
    integer :: k
    character(len=:), allocatable :: me
    call need_init("xios_close_context_definition")
    do k = 1, ndom
      me = "xios_close_context_definition: domain " // trim(doms(k)%id)
      if (doms(k)%ibegin < 0 .or. doms(k)%ni < 0) call fail(me, "ibegin and ni are required")
      if (doms(k)%jbegin < 0) doms(k)%jbegin = 0
      if (doms(k)%nj < 0) doms(k)%nj = 1
      call check(c_set_domain(cstr(doms(k)%id), int(doms(k)%ibegin, c_int64_t), &
                              int(doms(k)%ni, c_int64_t), int(doms(k)%jbegin, c_int64_t), &
                              int(doms(k)%nj, c_int64_t), ptr_d(doms(k)%lon), &
                              ptr_d(doms(k)%lat), ptr_d(doms(k)%lonb), ptr_d(doms(k)%latb), &
                              mask_ptr(k), ptr_d(doms(k)%area)), me)
    end do
    call check(c_close_definition(), "xios_close_context_definition")
    closed = .true.
  end subroutine

  function mask_ptr(k) result(p)
    integer, intent(in) :: k
    type(c_ptr) :: p
    p = c_null_ptr
    if (allocated(doms(k)%mask)) p = c_loc(doms(k)%mask)
  end function

  ! --- time stepping and fields -------------------------------------------------------

  subroutine xios_update_calendar(step)
    integer, intent(in) :: step
    call check(c_update_timestep(int(step, c_int64_t)), "xios_update_calendar")
  end subroutine

  logical function xios_field_is_active(field_id, at_current_timestep_arg) result(active)
    character(len=*), intent(in) :: field_id
    logical, intent(in), optional :: at_current_timestep_arg
    integer(c_int) :: rc
    logical :: now
    now = .false.
    if (present(at_current_timestep_arg)) now = at_current_timestep_arg
    rc = c_is_active(cstr(field_id), 0_c_int64_t)
    if (rc < 0) call fail("xios_field_is_active(" // trim(field_id) // ")", last_error())
    ! "at all during the run" (XIOS's default): every field the servers know; a send no
    ! file wants at a step is checked and dropped by the client
    active = rc == 1 .or. .not. now
  end function

  !> The halo domain whose data shape is (n1, n2), or 0 (send the array as it is).
  integer function halo_domain(n1, n2) result(found)
    integer, intent(in) :: n1, n2
    integer :: k
    found = 0
    do k = 1, ndom
      if (doms(k)%data_dim == 2 .and. doms(k)%data_ni == n1 .and. doms(k)%data_nj == n2 &
          .and. (doms(k)%data_ni /= doms(k)%ni .or. doms(k)%data_nj /= doms(k)%nj)) then
        if (found /= 0) call fail("xios_send_field", "two domains have the data shape of " &
                                  // "this array: cannot tell which halo to drop")
        found = k
      end if
    end do
  end function

  subroutine send_d1(fieldid, field)
    character(len=*), intent(in) :: fieldid
    real(8), intent(in) :: field(:)
    call check(c_send_double(cstr(fieldid), real(field, c_double), size(field, kind=c_int64_t)), &
               "xios_send_field(" // trim(fieldid) // ")")
  end subroutine

  subroutine send_d2(fieldid, field)
    character(len=*), intent(in) :: fieldid
    real(8), intent(in) :: field(:, :)
    call send_d1(fieldid, interior_d(reshape(field, [size(field)]), size(field, 1), &
                                     size(field, 2), 1))
  end subroutine

  subroutine send_d3(fieldid, field)
    character(len=*), intent(in) :: fieldid
    real(8), intent(in) :: field(:, :, :)
    call send_d1(fieldid, interior_d(reshape(field, [size(field)]), size(field, 1), &
                                     size(field, 2), size(field, 3)))
  end subroutine

  !> The array without the halo of its domain (see halo_domain), flattened.
  function interior_d(flat, n1, n2, n3) result(out)
    integer, intent(in) :: n1, n2, n3
    real(8), intent(in) :: flat(n1, n2, n3)
    real(8), allocatable :: out(:)
    integer :: k, i0, j0
    k = halo_domain(n1, n2)
    if (k == 0) then
      out = reshape(flat, [n1 * n2 * n3])
      return
    end if
    i0 = 1 - doms(k)%data_ibegin
    j0 = 1 - doms(k)%data_jbegin
    out = reshape(flat(i0:i0 + doms(k)%ni - 1, j0:j0 + doms(k)%nj - 1, :), &
                  [doms(k)%ni * doms(k)%nj * n3])
  end function

  subroutine send_f1(fieldid, field)
    character(len=*), intent(in) :: fieldid
    real(4), intent(in) :: field(:)
    call check(c_send_float(cstr(fieldid), real(field, c_float), size(field, kind=c_int64_t)), &
               "xios_send_field(" // trim(fieldid) // ")")
  end subroutine

  subroutine send_f2(fieldid, field)
    character(len=*), intent(in) :: fieldid
    real(4), intent(in) :: field(:, :)
    call send_f1(fieldid, interior_f(reshape(field, [size(field)]), size(field, 1), &
                                     size(field, 2), 1))
  end subroutine

  subroutine send_f3(fieldid, field)
    character(len=*), intent(in) :: fieldid
    real(4), intent(in) :: field(:, :, :)
    call send_f1(fieldid, interior_f(reshape(field, [size(field)]), size(field, 1), &
                                     size(field, 2), size(field, 3)))
  end subroutine

  function interior_f(flat, n1, n2, n3) result(out)
    integer, intent(in) :: n1, n2, n3
    real(4), intent(in) :: flat(n1, n2, n3)
    real(4), allocatable :: out(:)
    integer :: k, i0, j0
    k = halo_domain(n1, n2)
    if (k == 0) then
      out = reshape(flat, [n1 * n2 * n3])
      return
    end if
    i0 = 1 - doms(k)%data_ibegin
    j0 = 1 - doms(k)%data_jbegin
    out = reshape(flat(i0:i0 + doms(k)%ni - 1, j0:j0 + doms(k)%nj - 1, :), &
                  [doms(k)%ni * doms(k)%nj * n3])
  end function

  ! --- the end ----------------------------------------------------------------------------

  subroutine xios_context_finalize()
    type(report_t) :: rep
    call need_init("xios_context_finalize")
    call check(c_finalize(rep), "xios_context_finalize")
  end subroutine

  subroutine xios_finalize()
    if (started_mpi) then
      if (c_mpi_finalize() /= 0) call fail("xios_finalize", "MPI_Finalize failed")
    end if
    initialized = .false.
  end subroutine

  ! --- xios_duration arithmetic (XIOS's operators) ------------------------------------

  function real_times_duration(r, d) result(out)
    real(8), intent(in) :: r
    type(xios_duration), intent(in) :: d
    type(xios_duration) :: out
    out = xios_duration(r * d%year, r * d%month, r * d%day, r * d%hour, r * d%minute, &
                        r * d%second, r * d%timestep)
  end function

  function int_times_duration(i, d) result(out)
    integer, intent(in) :: i
    type(xios_duration), intent(in) :: d
    type(xios_duration) :: out
    out = real_times_duration(real(i, 8), d)
  end function

  function duration_plus_duration(a, b) result(out)
    type(xios_duration), intent(in) :: a, b
    type(xios_duration) :: out
    out = xios_duration(a%year + b%year, a%month + b%month, a%day + b%day, a%hour + b%hour, &
                        a%minute + b%minute, a%second + b%second, a%timestep + b%timestep)
  end function

end module xios
