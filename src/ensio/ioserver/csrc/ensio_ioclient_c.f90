! ensio_ioclient_c.f90 -- the C client's entry points as Fortran interfaces (module
! ensio_ioclient_c), one copy used by both Fortran modules: ensio_ioclient (the native
! API) and xios (XIOS's routine names). Not an API of its own: models use those two.
module ensio_ioclient_c
  use, intrinsic :: iso_c_binding
  implicit none
  public

  type, bind(c), public :: ensio_ioclient_report_t
    real(c_double) :: blocked_seconds = 0
    integer(c_int64_t) :: bytes_sent = 0
    real(c_double) :: server_busy_fraction = 0
    integer(c_int64_t) :: server_memory_hwm_bytes = 0
    integer(c_int64_t) :: bytes_written = 0
    integer(c_int64_t) :: files_written = 0
  end type

  abstract interface
    integer(c_int) function c_put(var, ndim, start, shape, block) bind(c)
      import :: c_int, c_char, c_int64_t, c_ptr
      character(kind=c_char), intent(in) :: var(*)
      integer(c_int), value :: ndim
      integer(c_int64_t), intent(in) :: start(*), shape(*)
      type(c_ptr), value :: block
    end function
    integer(c_int) function c_get(path, var, ndim, start, shape, block) bind(c)
      import :: c_int, c_char, c_int64_t, c_ptr
      character(kind=c_char), intent(in) :: path(*), var(*)
      integer(c_int), value :: ndim
      integer(c_int64_t), intent(in) :: start(*), shape(*)
      type(c_ptr), value :: block
    end function
  end interface

  procedure(c_put), bind(c, name="ensio_ioclient_restart_put_double") :: c_put_double
  procedure(c_put), bind(c, name="ensio_ioclient_restart_put_float") :: c_put_float
  procedure(c_put), bind(c, name="ensio_ioclient_restart_put_int") :: c_put_int
  procedure(c_get), bind(c, name="ensio_ioclient_read_restart_double") :: c_get_double
  procedure(c_get), bind(c, name="ensio_ioclient_read_restart_float") :: c_get_float
  procedure(c_get), bind(c, name="ensio_ioclient_read_restart_int") :: c_get_int

  interface
    integer(c_int) function c_init(world, context, model) bind(c, name="ensio_ioclient_init_f")
      import :: c_int, c_char
      integer(c_int), value :: world
      character(kind=c_char), intent(in) :: context(*)
      integer(c_int), intent(out) :: model
    end function
    integer(c_int) function c_init_config(world, context, config, model) &
        bind(c, name="ensio_ioclient_init_config_f")
      import :: c_int, c_char
      integer(c_int), value :: world
      character(kind=c_char), intent(in) :: context(*), config(*)
      integer(c_int), intent(out) :: model
    end function
    integer(c_int) function c_restart_begin(path, tmpl) bind(c, name="ensio_ioclient_restart_begin")
      import :: c_int, c_char
      character(kind=c_char), intent(in) :: path(*), tmpl(*)
    end function
    integer(c_int) function c_write_restart() bind(c, name="ensio_ioclient_write_restart")
      import :: c_int
    end function
    integer(c_int) function c_fail(text) bind(c, name="ensio_ioclient_fail_f")
      import :: c_int, c_char
      character(kind=c_char), intent(in) :: text(*)
    end function
    integer(c_int) function c_set_domain(id, ibegin, ni, jbegin, nj, lon, lat, lonb, latb, &
                                         mask, area) bind(c, name="ensio_ioclient_set_domain")
      import :: c_int, c_char, c_int64_t, c_ptr
      character(kind=c_char), intent(in) :: id(*)
      integer(c_int64_t), value :: ibegin, ni, jbegin, nj
      type(c_ptr), value :: lon, lat, lonb, latb, mask, area
    end function
    integer(c_int) function c_close_definition() bind(c, name="ensio_ioclient_close_definition")
      import :: c_int
    end function
    integer(c_int) function c_update_timestep(step) bind(c, name="ensio_ioclient_update_timestep")
      import :: c_int, c_int64_t
      integer(c_int64_t), value :: step
    end function
    integer(c_int) function c_send_double(id, data, count) bind(c, name="ensio_ioclient_send_double")
      import :: c_int, c_char, c_double, c_int64_t
      character(kind=c_char), intent(in) :: id(*)
      real(c_double), intent(in) :: data(*)
      integer(c_int64_t), value :: count
    end function
    integer(c_int) function c_send_float(id, data, count) bind(c, name="ensio_ioclient_send_float")
      import :: c_int, c_char, c_float, c_int64_t
      character(kind=c_char), intent(in) :: id(*)
      real(c_float), intent(in) :: data(*)
      integer(c_int64_t), value :: count
    end function
    integer(c_int) function c_is_active(id, step) bind(c, name="ensio_ioclient_is_active")
      import :: c_int, c_char, c_int64_t
      character(kind=c_char), intent(in) :: id(*)
      integer(c_int64_t), value :: step
    end function
    integer(c_int) function c_finalize(report) bind(c, name="ensio_ioclient_finalize")
      import :: c_int, ensio_ioclient_report_t
      type(ensio_ioclient_report_t), intent(out) :: report
    end function
    integer(c_int) function c_abort(reason) bind(c, name="ensio_ioclient_abort")
      import :: c_int, c_char
      character(kind=c_char), intent(in) :: reason(*)
    end function
    type(c_ptr) function c_errmsg() bind(c, name="ensio_ioclient_errmsg")
      import :: c_ptr
    end function
    integer(c_size_t) function c_strlen(s) bind(c, name="strlen")
      import :: c_size_t, c_ptr
      type(c_ptr), value :: s
    end function
    subroutine c_fatal() bind(c, name="ensio_ioclient_fatal_f")
    end subroutine
    integer(c_int) function c_mpi_init() bind(c, name="ensio_ioclient_mpi_init_f")
      import :: c_int
    end function
    integer(c_int) function c_mpi_finalize() bind(c, name="ensio_ioclient_mpi_finalize_f")
      import :: c_int
    end function
    integer(c_int) function c_mpi_initialized(flag) bind(c, name="MPI_Initialized")
      import :: c_int
      integer(c_int), intent(out) :: flag
    end function
    integer(c_int) function c_comm_world() bind(c, name="ensio_ioclient_comm_world_f")
      import :: c_int
    end function
    integer(c_int) function c_comm_rank(comm, rank) bind(c, name="ensio_ioclient_comm_rank_f")
      import :: c_int
      integer(c_int), value :: comm
      integer(c_int), intent(out) :: rank
    end function
    integer(c_int) function c_comm_size(comm, size) bind(c, name="ensio_ioclient_comm_size_f")
      import :: c_int
      integer(c_int), value :: comm
      integer(c_int), intent(out) :: size
    end function
  end interface

contains

  !> ``s`` without trailing blanks, NUL-terminated for the C entry points.
  function cstr(s) result(c)
    character(len=*), intent(in) :: s
    character(kind=c_char, len=len_trim(s) + 1) :: c
    c = trim(s) // c_null_char
  end function

  !> The C client's last error (one line naming the field or domain and the rank).
  function last_error() result(msg)
    character(len=:), allocatable :: msg
    type(c_ptr) :: p
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    p = c_errmsg()
    n = int(c_strlen(p))
    call c_f_pointer(p, chars, [n])
    allocate(character(len=n) :: msg)
    do i = 1, n
      msg(i:i) = chars(i)
    end do
  end function

end module ensio_ioclient_c
