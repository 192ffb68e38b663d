"""A correct but slow build of milestone 3: the same hits, the chain walked again for each block."""
WHAT = ("match finds each block's parent by walking the chain again from the first block, instead "
        "of keeping the last entry found: quadratic in the prefix's length")
CHAPTER = "07"
EDITS = [("            entry = self.lookup(chain[-1] if chain else None, tokens)\n",
          "            parent = None\n"
          "            for earlier in range(index):       # the chain again, from the start\n"
          "                parent = self.lookup(parent, tuple(token_ids[earlier * size:\n"
          "                                                            (earlier + 1) * size]))\n"
          "            entry = self.lookup(parent, tokens)\n")]
MILESTONE = 3
