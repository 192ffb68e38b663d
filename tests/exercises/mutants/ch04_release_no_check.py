WHAT = "release() of a free block goes negative instead of refusing"
CHAPTER = "04"
EDITS = [("        if self.ref_counts[block] < 1:\n"
          "            raise RuntimeError(f\"block {block} released more times",
          "        if False:\n"
          "            raise RuntimeError(f\"block {block} released more times")]
CHECKS = "ch04 and (refuses_misuse or behaves_like)"
