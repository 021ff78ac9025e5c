! ensio_ioclient.f90 -- Fortran module over the C client of the ensio I/O server.
!
! Thin iso_c_binding wrappers over ensio_ioclient.h: communicators are default
! integers (the handle of the Fortran MPI bindings; converted with MPI_Comm_f2c in
! the C library), fields are contiguous real(8) or real(4) arrays of rank 1, 2 or 3
! (a non-contiguous section is copied).  Fortran order: a field on a grid
! (ni, nj[, nk]) is, in memory, the C (nk, nj, ni) array the protocol sends.
! Domain offsets ibegin/jbegin are 0-based, as in the C API and the config.
!
! Every routine takes an optional ierr: 0 on success; on error it is non-zero and
! ensio_ioclient_errmsg() is the one-line message.  Without ierr an error ends the
! whole job (XIOS behaves the same way): the servers close their files and print the
! message once, naming the rank, and every rank exits non-zero.
!
!   call ensio_ioclient_init(world, "atm", comm)
!   call ensio_ioclient_set_domain("atm", ibegin, ni, jbegin, nj, lon=lon, lat=lat)
!   call ensio_ioclient_close_definition()
!   do step = 1, nsteps
!     call ensio_ioclient_update_timestep(step)
!     if (ensio_ioclient_is_active("tas", step)) call ensio_ioclient_send("tas", tas)
!   end do
!   call ensio_ioclient_finalize(report)
!
! Modes: without config, server mode (an MPMD job with `ensio ioserver` ranks); with
! config="iodef.yaml", ioserver.mode of that file decides, as Python's start: attached
! and sync run the Python client in the model process (same semantics, same files).
!
! Restarts (Python's Client.write_restart / read_restart): restart_begin(path,
! template), ensio_ioclient_restart_put(variable, start, block) per variable, then
! ensio_ioclient_write_restart() on every model rank; ensio_ioclient_read_restart(path,
! variable, start, block) reads this rank's box (any decomposition: P ranks write, Q
! read, bitwise).  start is the block's 0-based global index per dimension in Fortran
! order (as the block's dimensions; the file's netCDF dimensions reversed, as
! netCDF-Fortran shows them); blocks are contiguous real(8), real(4) or integer(4)
! arrays of any rank (start has one index per dimension).
!
! Programs built without Fortran MPI bindings (a pip MPICH has none) can use
! ensio_ioclient_mpi_init, ensio_ioclient_comm_world, ensio_ioclient_comm_rank/size
! and ensio_ioclient_mpi_finalize.
module ensio_ioclient
  use, intrinsic :: iso_c_binding
  use ensio_ioclient_c
  implicit none
  private

  public :: ensio_ioclient_report_t

  public :: ensio_ioclient_init, ensio_ioclient_set_domain, ensio_ioclient_close_definition
  public :: ensio_ioclient_update_timestep, ensio_ioclient_send, ensio_ioclient_is_active
  public :: ensio_ioclient_finalize, ensio_ioclient_abort, ensio_ioclient_errmsg
  public :: ensio_ioclient_mpi_init, ensio_ioclient_mpi_finalize, ensio_ioclient_comm_world
  public :: ensio_ioclient_comm_rank, ensio_ioclient_comm_size
  public :: ensio_ioclient_restart_begin, ensio_ioclient_restart_put
  public :: ensio_ioclient_write_restart, ensio_ioclient_read_restart

  interface ensio_ioclient_send
    module procedure send_d1, send_d2, send_d3, send_f1, send_f2, send_f3
  end interface

  interface ensio_ioclient_restart_put
    module procedure put_d, put_f, put_i
  end interface

  interface ensio_ioclient_read_restart
    module procedure get_d, get_f, get_i
  end interface


contains


  !> The last error, one line naming the field or domain and the rank.
  function ensio_ioclient_errmsg() result(msg)
    character(len=:), allocatable :: msg
    msg = last_error()
  end function

  !> ierr = rc when present; otherwise an error ends the job (ensio_ioclient_fatal_f:
  !> the servers close the files and print one line naming this rank; no other rank hangs).
  subroutine check(rc, ierr)
    integer(c_int), intent(in) :: rc
    integer, intent(out), optional :: ierr
    if (present(ierr)) then
      ierr = int(rc)
    else if (rc /= 0) then
      call c_fatal()
    end if
  end subroutine

  !> config (optional): a YAML file whose ioserver.mode decides the mode (see above).
  subroutine ensio_ioclient_init(world, context, model_comm, ierr, config)
    integer, intent(in) :: world
    character(len=*), intent(in) :: context
    integer, intent(out) :: model_comm
    integer, intent(out), optional :: ierr
    character(len=*), intent(in), optional :: config
    integer(c_int) :: m
    m = 0
    if (present(config)) then
      call check(c_init_config(int(world, c_int), cstr(context), cstr(config), m), ierr)
    else
      call check(c_init(int(world, c_int), cstr(context), m), ierr)
    end if
    model_comm = int(m)
  end subroutine

  !> This rank's part [ibegin, ibegin+ni) x [jbegin, jbegin+nj) (0-based) of a domain;
  !> lon/lat (ni)/(nj) rectilinear, (ni,nj) curvilinear, (ni) unstructured; bounds
  !> (2,ni)/(2,nj), (4,ni,nj), (nvertex,ni); mask (1 = valid) and area (ni,nj).
  subroutine ensio_ioclient_set_domain(domain_id, ibegin, ni, jbegin, nj, lon, lat, &
                                       lon_bounds, lat_bounds, mask, area, ierr)
    character(len=*), intent(in) :: domain_id
    integer, intent(in) :: ibegin, ni, jbegin, nj
    real(c_double), intent(in), target, optional :: lon(*), lat(*), lon_bounds(*)
    real(c_double), intent(in), target, optional :: lat_bounds(*), area(*)
    integer(c_int), intent(in), target, optional :: mask(*)
    integer, intent(out), optional :: ierr
    type(c_ptr) :: p(6)
    p = c_null_ptr
    if (present(lon)) p(1) = c_loc(lon)
    if (present(lat)) p(2) = c_loc(lat)
    if (present(lon_bounds)) p(3) = c_loc(lon_bounds)
    if (present(lat_bounds)) p(4) = c_loc(lat_bounds)
    if (present(mask)) p(5) = c_loc(mask)
    if (present(area)) p(6) = c_loc(area)
    call check(c_set_domain(cstr(domain_id), int(ibegin, c_int64_t), int(ni, c_int64_t), &
                            int(jbegin, c_int64_t), int(nj, c_int64_t), &
                            p(1), p(2), p(3), p(4), p(5), p(6)), ierr)
  end subroutine

  subroutine ensio_ioclient_close_definition(ierr)
    integer, intent(out), optional :: ierr
    call check(c_close_definition(), ierr)
  end subroutine

  subroutine ensio_ioclient_update_timestep(step, ierr)
    integer, intent(in) :: step
    integer, intent(out), optional :: ierr
    call check(c_update_timestep(int(step, c_int64_t)), ierr)
  end subroutine

  !> Does any file want field_id at step (default: the current step)?
  logical function ensio_ioclient_is_active(field_id, step, ierr) result(active)
    character(len=*), intent(in) :: field_id
    integer, intent(in), optional :: step
    integer, intent(out), optional :: ierr
    integer(c_int64_t) :: s
    integer(c_int) :: rc
    s = 0
    if (present(step)) s = int(step, c_int64_t)
    rc = c_is_active(cstr(field_id), s)
    active = rc == 1
    call check(merge(1_c_int, 0_c_int, rc < 0), ierr)
  end function

  subroutine send_d1(field_id, data, ierr)
    character(len=*), intent(in) :: field_id
    real(c_double), intent(in), contiguous :: data(:)
    integer, intent(out), optional :: ierr
    call check(c_send_double(cstr(field_id), data, size(data, kind=c_int64_t)), ierr)
  end subroutine

  subroutine send_d2(field_id, data, ierr)
    character(len=*), intent(in) :: field_id
    real(c_double), intent(in), contiguous :: data(:, :)
    integer, intent(out), optional :: ierr
    call check(c_send_double(cstr(field_id), data, size(data, kind=c_int64_t)), ierr)
  end subroutine

  subroutine send_d3(field_id, data, ierr)
    character(len=*), intent(in) :: field_id
    real(c_double), intent(in), contiguous :: data(:, :, :)
    integer, intent(out), optional :: ierr
    call check(c_send_double(cstr(field_id), data, size(data, kind=c_int64_t)), ierr)
  end subroutine

  subroutine send_f1(field_id, data, ierr)
    character(len=*), intent(in) :: field_id
    real(c_float), intent(in), contiguous :: data(:)
    integer, intent(out), optional :: ierr
    call check(c_send_float(cstr(field_id), data, size(data, kind=c_int64_t)), ierr)
  end subroutine

  subroutine send_f2(field_id, data, ierr)
    character(len=*), intent(in) :: field_id
    real(c_float), intent(in), contiguous :: data(:, :)
    integer, intent(out), optional :: ierr
    call check(c_send_float(cstr(field_id), data, size(data, kind=c_int64_t)), ierr)
  end subroutine

  subroutine send_f3(field_id, data, ierr)
    character(len=*), intent(in) :: field_id
    real(c_float), intent(in), contiguous :: data(:, :, :)
    integer, intent(out), optional :: ierr
    call check(c_send_float(cstr(field_id), data, size(data, kind=c_int64_t)), ierr)
  end subroutine

  subroutine ensio_ioclient_finalize(report, ierr)
    type(ensio_ioclient_report_t), intent(out), optional :: report
    integer, intent(out), optional :: ierr
    type(ensio_ioclient_report_t) :: rep
    call check(c_finalize(rep), ierr)
    if (present(report)) report = rep
  end subroutine

  subroutine ensio_ioclient_abort(reason, ierr)
    character(len=*), intent(in) :: reason
    integer, intent(out), optional :: ierr
    call check(c_abort(cstr(reason)), ierr)
  end subroutine

  !> Start restart path (a copy of template with the variables put before write_restart).
  subroutine ensio_ioclient_restart_begin(path, template, ierr)
    character(len=*), intent(in) :: path, template
    integer, intent(out), optional :: ierr
    call check(c_restart_begin(cstr(path), cstr(template)), ierr)
  end subroutine

  !> Hand this rank's blocks to the writers (every model rank, each restart).
  subroutine ensio_ioclient_write_restart(ierr)
    integer, intent(out), optional :: ierr
    call check(c_write_restart(), ierr)
  end subroutine

  !> start/shape in Fortran order -> C order (reversed), 64-bit.
  subroutine c_order(start, shp, cstart, cshape)
    integer, intent(in) :: start(:), shp(:)
    integer(c_int64_t), intent(out) :: cstart(size(start)), cshape(size(start))
    cstart = int(start(size(start):1:-1), c_int64_t)
    cshape = int(shp(size(shp):1:-1), c_int64_t)
  end subroutine

  integer(c_int) function bad_start(fn, variable, nstart, ndim) result(rc)
    character(len=*), intent(in) :: fn, variable
    integer, intent(in) :: nstart, ndim
    character(len=256) :: text
    write (text, "(a, ': ', a, ': start has ', i0, ' indices for a ', i0, '-d block')") &
        fn, variable, nstart, ndim
    rc = c_fail(cstr(text))
  end function

  integer(c_int) function put(variable, what, start, shp, p) result(rc)
    character(len=*), intent(in) :: variable, what
    integer, intent(in) :: start(:), shp(:)
    type(c_ptr), intent(in) :: p
    integer(c_int64_t) :: cs(size(start)), cn(size(start))
    procedure(c_put), pointer :: fn
    if (size(start) /= size(shp)) then
      rc = bad_start("ensio_ioclient_restart_put", variable, size(start), size(shp))
      return
    end if
    call c_order(start, shp, cs, cn)
    select case (what)
    case ("double")
      fn => c_put_double
    case ("float")
      fn => c_put_float
    case default
      fn => c_put_int
    end select
    rc = fn(cstr(variable), int(size(start), c_int), cs, cn, p)
  end function

  integer(c_int) function get(path, variable, what, start, shp, p) result(rc)
    character(len=*), intent(in) :: path, variable, what
    integer, intent(in) :: start(:), shp(:)
    type(c_ptr), intent(in) :: p
    integer(c_int64_t) :: cs(size(start)), cn(size(start))
    procedure(c_get), pointer :: fn
    if (size(start) /= size(shp)) then
      rc = bad_start("ensio_ioclient_read_restart", variable, size(start), size(shp))
      return
    end if
    call c_order(start, shp, cs, cn)
    select case (what)
    case ("double")
      fn => c_get_double
    case ("float")
      fn => c_get_float
    case default
      fn => c_get_int
    end select
    rc = fn(cstr(path), cstr(variable), int(size(start), c_int), cs, cn, p)
  end function

  subroutine put_d(variable, start, block, ierr)
    character(len=*), intent(in) :: variable
    integer, intent(in) :: start(:)
    real(c_double), intent(in), contiguous, target :: block(..)
    integer, intent(out), optional :: ierr
    call check(put(variable, "double", start, shape(block), c_loc(block)), ierr)
  end subroutine

  subroutine get_d(path, variable, start, block, ierr)
    character(len=*), intent(in) :: path, variable
    integer, intent(in) :: start(:)
    real(c_double), intent(inout), contiguous, target :: block(..)
    integer, intent(out), optional :: ierr
    call check(get(path, variable, "double", start, shape(block), c_loc(block)), ierr)
  end subroutine

  subroutine put_f(variable, start, block, ierr)
    character(len=*), intent(in) :: variable
    integer, intent(in) :: start(:)
    real(c_float), intent(in), contiguous, target :: block(..)
    integer, intent(out), optional :: ierr
    call check(put(variable, "float", start, shape(block), c_loc(block)), ierr)
  end subroutine

  subroutine get_f(path, variable, start, block, ierr)
    character(len=*), intent(in) :: path, variable
    integer, intent(in) :: start(:)
    real(c_float), intent(inout), contiguous, target :: block(..)
    integer, intent(out), optional :: ierr
    call check(get(path, variable, "float", start, shape(block), c_loc(block)), ierr)
  end subroutine

  subroutine put_i(variable, start, block, ierr)
    character(len=*), intent(in) :: variable
    integer, intent(in) :: start(:)
    integer(c_int32_t), intent(in), contiguous, target :: block(..)
    integer, intent(out), optional :: ierr
    call check(put(variable, "int", start, shape(block), c_loc(block)), ierr)
  end subroutine

  subroutine get_i(path, variable, start, block, ierr)
    character(len=*), intent(in) :: path, variable
    integer, intent(in) :: start(:)
    integer(c_int32_t), intent(inout), contiguous, target :: block(..)
    integer, intent(out), optional :: ierr
    call check(get(path, variable, "int", start, shape(block), c_loc(block)), ierr)
  end subroutine

  subroutine ensio_ioclient_mpi_init(ierr)
    integer, intent(out), optional :: ierr
    call check(c_mpi_init(), ierr)
  end subroutine

  subroutine ensio_ioclient_mpi_finalize(ierr)
    integer, intent(out), optional :: ierr
    call check(c_mpi_finalize(), ierr)
  end subroutine

  integer function ensio_ioclient_comm_world() result(comm)
    comm = int(c_comm_world())
  end function

  subroutine ensio_ioclient_comm_rank(comm, rank, ierr)
    integer, intent(in) :: comm
    integer, intent(out) :: rank
    integer, intent(out), optional :: ierr
    integer(c_int) :: r
    call check(c_comm_rank(int(comm, c_int), r), ierr)
    rank = int(r)
  end subroutine

  subroutine ensio_ioclient_comm_size(comm, size, ierr)
    integer, intent(in) :: comm
    integer, intent(out) :: size
    integer, intent(out), optional :: ierr
    integer(c_int) :: s
    call check(c_comm_size(int(comm, c_int), s), ierr)
    size = int(s)
  end subroutine

end module ensio_ioclient
