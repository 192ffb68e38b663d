WHAT = "evict hands the block out but keeps its entry: a later match finds KV that was overwritten"
CHAPTER = "07"
EDITS = [("        entry = self.by_block.pop(block)\n        del self.by_hash[entry.hash]\n",
          "")]
CHECKS = "ch07 and (worked or behaves_like)"
