WHAT = "off by one in the block index: position p looks in block p // block_size + 1"
CHAPTER = "04"
EDITS = [("block_table[p // block_size] * block_size", "block_table[min(p // block_size + 1, "
          "len(block_table) - 1)] * block_size")]
CHECKS = "ch04 and (worked or slot_mapping)"
