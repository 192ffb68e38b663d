WHAT = "no all-reduce: each rank returns its own partial sum"
CHAPTER = "13"
EDITS = [("""    partial = x_shard @ weight_shard.T
    all_reduce(partial)
""", """    partial = x_shard @ weight_shard.T
""")]
CHECKS = "ch13 and (worked or two_processes)"
