WHAT = "the bias added to every rank's partial sum, so the all-reduce adds it once per rank"
CHAPTER = "13"
EDITS = [("""    partial = x_shard @ weight_shard.T
    all_reduce(partial)
    return partial if bias is None else partial + bias""",
          """    partial = x_shard @ weight_shard.T
    if bias is not None:
        partial = partial + bias
    all_reduce(partial)
    return partial""")]
CHECKS = "ch13 and (worked or two_processes)"
