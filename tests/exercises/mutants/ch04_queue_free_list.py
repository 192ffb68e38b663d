WHAT = ("the free list is a queue where the contract asks for minicb's stack: a freed block "
        "goes to the back instead of being reused next")
CHAPTER = "04"
EDITS = [("self.free_blocks.append(block)", "self.free_blocks.insert(0, block)")]
CHECKS = "ch04 and (worked or behaves_like)"
