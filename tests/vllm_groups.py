"""Group memberships written out by hand from vLLM's ``initialize_model_parallel``
(``arange(world).reshape(dp, pp, tp)``; TP = rows, PP = transpose(pp, tp), DP =
transpose(dp, tp), EP = transpose(dp, pp) flattened over (dp, tp)). Independent of
``testbed.cluster.layout``: these are the reference the layout and the live ranks are checked against.
"""

EXPECTED_GROUPS = {
    (2, 1, 2, 1): {
        "tp": [[0], [1]],
        "pp": [[0], [1]],
        "dp": [[0, 1]],
        "ep": [[0, 1]],
    },
    (4, 2, 2, 1): {
        "tp": [[0, 1], [2, 3]],
        "pp": [[0], [1], [2], [3]],
        "dp": [[0, 2], [1, 3]],
        "ep": [[0, 1, 2, 3]],
    },
    (4, 1, 2, 2): {
        "tp": [[0], [1], [2], [3]],
        "pp": [[0, 1], [2, 3]],
        "dp": [[0, 2], [1, 3]],
        "ep": [[0, 2], [1, 3]],
    },
    (8, 2, 2, 2): {
        "tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
        "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
        "dp": [[0, 4], [1, 5], [2, 6], [3, 7]],
        "ep": [[0, 1, 4, 5], [2, 3, 6, 7]],
    },
}


def group_containing(groups: list[list[int]], rank: int) -> tuple[int, ...]:
    (group,) = [g for g in groups if rank in g]
    return tuple(group)
