WHAT = "the shared-memory all-reduce sums the slots without waiting for the other ranks' flags"
CHAPTER = "13"
EDITS = [("""    while bool((flags < call).any()):
        pass
""", "")]
CHECKS = "ch13 and (worked or two_processes)"
