WHAT = "the slot mapping ignores the block table: slot = position"
CHAPTER = "04"
EDITS = [("return [block_table[p // block_size] * block_size + p % block_size",
          "return [p")]
CHECKS = "ch04 and (worked or slot_mapping)"
