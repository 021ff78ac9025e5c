from ensio.parallel import block_distribution, io_groups


def test_io_groups_partition_ranks(comm):
    for n_io in range(1, comm.size + 1):
        g = io_groups(comm, n_io)
        groups = comm.allgather((g.group, g.is_io, g.group_comm.size))
        assert sorted({x[0] for x in groups}) == list(range(n_io))
        assert sum(1 for x in groups if x[1]) == n_io
        for t in range(n_io):
            start, count = block_distribution(comm.size, n_io, t)
            members = [r for r, x in enumerate(groups) if x[0] == t]
            assert members == list(range(start, start + count))
        g.free()
