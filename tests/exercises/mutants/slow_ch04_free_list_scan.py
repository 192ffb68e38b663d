"""A correct but slow build of milestone 2: the same blocks in the same order, found by a scan."""
WHAT = ("allocate takes the block on top of the free list with free_blocks.remove(), which scans "
        "the whole list from the front for it, instead of pop()")
CHAPTER = "04"
EDITS = [("        block = self.free_blocks.pop()\n",
          "        block = self.free_blocks[-1]\n        self.free_blocks.remove(block)\n")]
MILESTONE = 2
