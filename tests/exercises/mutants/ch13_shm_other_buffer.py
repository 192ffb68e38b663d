WHAT = "the shared-memory all-reduce sums the other call's buffer instead of this call's"
CHAPTER = "13"
EDITS = [("""    torch.sum(buffer[:, :tensor.numel()], dim=0, out=tensor)
""", """    torch.sum(slots[(call + 1) % 2][:, :tensor.numel()], dim=0, out=tensor)
""")]
CHECKS = "ch13 and (worked or two_processes)"
