! stencil.f90 -- the Fortran twin of `ensio model stencil` (ensio.models.stencil).
!
! Why a twin: the output cost that matters is the one a compiled model pays (issue 27:
! `ensio bench ioserver --model fortran`). Same 3-D diffusion, initial state, row
! decomposition, fields and output calls as the Python model, with the arithmetic in
! numpy's order (no reassociation, no FMA), so both write the same numbers:
!
!   T <- T + kappa (lap_h T + 1/2 lap_z T) + 1e-3 sin(0.01 n)   at step n, kappa = 0.1
!
! periodic in longitude, closed (mirrored) at the poles and at the top/bottom levels.
! Every output step it sends fields 3-D fields f00, f01, ... (field i = T (1 + 0.01 i))
! and the surface field sfc (the first level) through the ensio I/O client; the mode
! comes from the config's ioserver.mode (server: an MPMD job with `ensio ioserver`).
!
! Usage (under mpiexec):  stencil CONFIG|none NX NY NZ FIELDS STEPS SWEEPS JSON
! CONFIG "none" runs without any output (the baseline). Model rank 0 writes JSON: the
! keys of ensio.models.stencil.RunResult but mode (the config says it; the caller knows).
!
! Arrays are t(nx, 0:nj+1, nz): longitude fastest, one halo row on each side; a field
! sent as (nx, nj, nz) is, in memory, the C (nz, nj, nx) array of the Python model.
module stencil_mpi
  use, intrinsic :: iso_c_binding
  implicit none
  interface
    integer(c_int) function stencil_sendrecv(comm, send, n, dest, recv, source) bind(c)
      import :: c_int, c_double
      integer(c_int), value :: comm, n, dest, source
      real(c_double), intent(in) :: send(*)
      real(c_double), intent(out) :: recv(*)
    end function
    integer(c_int) function stencil_dup(comm, out) bind(c)
      import :: c_int
      integer(c_int), value :: comm
      integer(c_int), intent(out) :: out
    end function
    integer(c_int) function stencil_free(comm) bind(c)
      import :: c_int
      integer(c_int), value :: comm
    end function
    integer(c_int) function stencil_barrier(comm) bind(c)
      import :: c_int
      integer(c_int), value :: comm
    end function
    integer(c_int) function stencil_max(comm, x) bind(c)
      import :: c_int, c_double
      integer(c_int), value :: comm
      real(c_double), intent(inout) :: x
    end function
    real(c_double) function stencil_wtime() bind(c)
      import :: c_double
    end function
  end interface
end module stencil_mpi

module stencil_kernel
  use, intrinsic :: iso_c_binding
  use stencil_mpi
  implicit none
  real(8), parameter :: kappa = 0.1d0

contains

  !> Exchange one halo row with each neighbour (rank - 1 holds the rows before ours);
  !> mirror the edge row where there is none (closed poles).
  subroutine halo(comm, rank, nproc, t, nx, nj, nz, sbuf, rbuf)
    integer, intent(in) :: comm, rank, nproc, nx, nj, nz
    real(8), intent(inout) :: t(nx, 0:nj + 1, nz)
    real(8), intent(inout) :: sbuf(nx, nz), rbuf(nx, nz)
    integer :: up, down
    up = merge(rank - 1, -1, rank > 0)
    down = merge(rank + 1, -1, rank < nproc - 1)
    if (up < 0) t(:, 0, :) = t(:, 1, :)
    if (down < 0) t(:, nj + 1, :) = t(:, nj, :)
    sbuf = t(:, 1, :)
    call ok(stencil_sendrecv(comm, sbuf, nx * nz, up, rbuf, down), "MPI_Sendrecv")
    if (down >= 0) t(:, nj + 1, :) = rbuf
    sbuf = t(:, nj, :)
    call ok(stencil_sendrecv(comm, sbuf, nx * nz, down, rbuf, up), "MPI_Sendrecv")
    if (up >= 0) t(:, 0, :) = rbuf
  end subroutine

  !> sweeps diffusion sweeps at step n, each after a halo exchange. The sums are
  !> written in numpy's order (ensio.models.stencil.StencilModel.step), parenthesised
  !> so that no compiler reassociates them: the same float64 numbers as the Python model.
  subroutine step(comm, rank, nproc, t, nx, nj, nz, n, sweeps, lap, sbuf, rbuf)
    integer, intent(in) :: comm, rank, nproc, nx, nj, nz, n, sweeps
    real(8), intent(inout) :: t(nx, 0:nj + 1, nz), lap(nx, nj, nz)
    real(8), intent(inout) :: sbuf(nx, nz), rbuf(nx, nz)
    real(8) :: force
    integer :: s, i, j, k
    force = 1d-3 * sin(0.01d0 * n)
    do s = 1, sweeps
      call halo(comm, rank, nproc, t, nx, nj, nz, sbuf, rbuf)
      do k = 1, nz
        do j = 1, nj
          ! the interior in one vectorisable loop, the periodic ends apart
          do i = 2, nx - 1
            lap(i, j, k) = (((t(i, j - 1, k) + t(i, j + 1, k)) + t(i - 1, j, k)) &
                            + t(i + 1, j, k)) - t(i, j, k) * 4d0
          end do
          lap(1, j, k) = (((t(1, j - 1, k) + t(1, j + 1, k)) + t(nx, j, k)) &
                          + t(min(2, nx), j, k)) - t(1, j, k) * 4d0
          if (nx > 1) lap(nx, j, k) = (((t(nx, j - 1, k) + t(nx, j + 1, k)) &
                                        + t(nx - 1, j, k)) + t(1, j, k)) - t(nx, j, k) * 4d0
          ! numpy: vert = 0; vert[1:] += T[k-1] - T[k]; vert[:-1] += T[k+1] - T[k]
          if (nz == 1) then
            do i = 1, nx
              lap(i, j, k) = (lap(i, j, k) + 0d0 * 0.5d0) * kappa
            end do
          else if (k == 1) then
            do i = 1, nx
              lap(i, j, k) = (lap(i, j, k) + ((0d0 + t(i, j, 2)) - t(i, j, 1)) * 0.5d0) * kappa
            end do
          else if (k == nz) then
            do i = 1, nx
              lap(i, j, k) = (lap(i, j, k) + ((0d0 + t(i, j, k - 1)) - t(i, j, k)) * 0.5d0) &
                             * kappa
            end do
          else
            do i = 1, nx
              lap(i, j, k) = (lap(i, j, k) + ((((0d0 + t(i, j, k - 1)) - t(i, j, k)) &
                              + t(i, j, k + 1)) - t(i, j, k)) * 0.5d0) * kappa
            end do
          end if
        end do
      end do
      do k = 1, nz
        do j = 1, nj
          do i = 1, nx
            t(i, j, k) = (t(i, j, k) + lap(i, j, k)) + force
          end do
        end do
      end do
    end do
  end subroutine

  subroutine ok(rc, what)
    integer(c_int), intent(in) :: rc
    character(len=*), intent(in) :: what
    if (rc /= 0) then
      write (0, "(a, ': MPI error ', i0)") what, rc
      error stop 1
    end if
  end subroutine

end module stencil_kernel

program stencil
  use, intrinsic :: iso_fortran_env, only: error_unit
  use ensio_ioclient
  use stencil_mpi
  use stencil_kernel
  implicit none
  character(len=4096) :: config, json, arg
  integer :: nx, ny, nz, nfields, nsteps, sweeps, a(6)
  integer :: world, comm, mcomm, rank, nproc, base, extra, j0, nj, n, f, i, j, k
  logical :: output
  real(8), allocatable :: t(:, :, :), lap(:, :, :), out(:, :, :), sbuf(:, :), rbuf(:, :)
  real(8), allocatable :: lon(:), lat(:)
  real(8) :: deg, t0, c, seconds, in_calls, in_close
  character(len=3) :: fid
  type(ensio_ioclient_report_t) :: rep

  call get_command_argument(1, config)
  do i = 1, 6
    call get_command_argument(i + 1, arg)
    read (arg, *) a(i)
  end do
  call get_command_argument(8, json)
  nx = a(1); ny = a(2); nz = a(3); nfields = a(4); nsteps = a(5); sweeps = a(6)
  if (min(nx, ny, nz, nsteps) < 1 .or. min(nfields, sweeps) < 0 .or. nfields > 100) then
    write (error_unit, "(a)") "stencil: nx, ny, nz, steps must be at least 1, fields and " // &
                              "sweeps at least 0 (fields at most 100)"
    error stop 2
  end if
  output = trim(config) /= "none"

  call ensio_ioclient_mpi_init()
  world = ensio_ioclient_comm_world()
  if (output) then
    call ensio_ioclient_init(world, "model", comm, config=trim(config))
  else
    comm = world
  end if
  call ok(stencil_dup(comm, mcomm), "MPI_Comm_dup")
  call ensio_ioclient_comm_rank(mcomm, rank)
  call ensio_ioclient_comm_size(mcomm, nproc)
  if (ny < nproc) then
    if (rank == 0) write (error_unit, "('ny: ', i0, ' latitude rows for ', i0, a)") ny, nproc, &
        " model ranks; every model rank needs at least one row"
    if (output) call ensio_ioclient_abort("ny: fewer latitude rows than model ranks")
    error stop 2
  end if
  ! ensio.parallel.distribution.RowDistribution: contiguous blocks, the first ranks one more
  base = ny / nproc
  extra = mod(ny, nproc)
  nj = base + merge(1, 0, rank < extra)
  j0 = rank * base + min(rank, extra)

  ! the initial state: a wave in longitude, cooler with height (numpy's order of operations)
  deg = acos(-1d0) / 180d0
  allocate(lon(nx), lat(nj), t(nx, 0:nj + 1, nz), lap(nx, nj, nz), out(nx, nj, nz))
  allocate(sbuf(nx, nz), rbuf(nx, nz))
  do i = 1, nx
    lon(i) = ((i - 0.5d0) * 360d0) / nx
  end do
  do j = 1, nj
    lat(j) = -90d0 + ((j0 + j - 0.5d0) * 180d0) / ny
  end do
  t = 0d0
  do k = 1, nz
    do j = 1, nj
      do i = 1, nx
        t(i, j, k) = (280d0 + (20d0 * cos(lat(j) * deg)) * cos(lon(i) * deg)) - 5d0 * (k - 1)
      end do
    end do
  end do

  if (output) then
    call ensio_ioclient_set_domain("dom", 0, nx, j0, nj, lon=lon, lat=lat)
    call ensio_ioclient_close_definition()
  end if
  call ok(stencil_barrier(mcomm), "MPI_Barrier")
  t0 = stencil_wtime()
  in_calls = 0d0
  in_close = 0d0
  do n = 1, nsteps
    if (output) then
      c = stencil_wtime()
      call ensio_ioclient_update_timestep(n)
      in_calls = in_calls + (stencil_wtime() - c)
    end if
    call step(mcomm, rank, nproc, t, nx, nj, nz, n, sweeps, lap, sbuf, rbuf)
    if (.not. output) cycle
    c = stencil_wtime()
    do f = 0, nfields - 1
      write (fid, "('f', i2.2)") f
      if (ensio_ioclient_is_active(fid, n)) then
        out = t(:, 1:nj, :) * (1d0 + 0.01d0 * f)
        call ensio_ioclient_send(fid, out)
      end if
    end do
    if (ensio_ioclient_is_active("sfc", n)) call ensio_ioclient_send("sfc", t(:, 1:nj, 1))
    in_calls = in_calls + (stencil_wtime() - c)
  end do
  if (output) then
    c = stencil_wtime()
    call ensio_ioclient_finalize(rep)
    in_close = stencil_wtime() - c
  end if
  call ok(stencil_barrier(mcomm), "MPI_Barrier")
  seconds = stencil_wtime() - t0
  call ok(stencil_max(mcomm, in_calls), "MPI_Allreduce")
  call ok(stencil_max(mcomm, in_close), "MPI_Allreduce")
  if (rank == 0) call write_json()
  call ok(stencil_free(mcomm), "MPI_Comm_free")
  call ensio_ioclient_mpi_finalize()

contains

  function num(x) result(s)
    real(8), intent(in) :: x
    character(len=:), allocatable :: s
    character(len=40) :: buf
    write (buf, "(es24.16e3)") x
    s = trim(adjustl(buf))
  end function

  function int8(x) result(s)
    integer(8), intent(in) :: x
    character(len=:), allocatable :: s
    character(len=24) :: buf
    write (buf, "(i0)") x
    s = trim(buf)
  end function

  subroutine write_json()
    integer :: u
    character(len=:), allocatable :: report
    if (output) then
      report = '{"blocked_seconds": ' // num(rep%blocked_seconds) // &
               ', "bytes_sent": ' // int8(rep%bytes_sent) // &
               ', "server_busy_fraction": ' // num(rep%server_busy_fraction) // &
               ', "server_memory_hwm_bytes": ' // int8(rep%server_memory_hwm_bytes) // &
               ', "bytes_written": ' // int8(rep%bytes_written) // &
               ', "files_written": ' // int8(rep%files_written) // '}'
    else
      report = "null"
    end if
    open (newunit=u, file=trim(json), status="replace", action="write")
    write (u, "(a)") '{"model": "fortran", "model_ranks": ' // &
        int8(int(nproc, 8)) // ', "steps": ' // int8(int(nsteps, 8)) // ', "seconds": ' // &
        num(seconds) // ', "seconds_in_output_calls": ' // num(in_calls + in_close) // &
        ', "seconds_in_close": ' // num(in_close) // ', "report": ' // report // '}'
    close (u)
  end subroutine

end program stencil
