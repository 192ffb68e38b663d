WHAT = "can_allocate forgets the block a copy-on-write will take"
CHAPTER = "04"
EDITS = [("        return missing + copies + reserve_blocks <= self.num_free_blocks()",
          "        return missing + reserve_blocks <= self.num_free_blocks()")]
CHECKS = "ch04 and manager_behaves_like"
