WHAT = "evicts the most recently parked block instead of the least recently parked"
CHAPTER = "07"
EDITS = [("block, _ = self.evictable.popitem(last=False)", "block, _ = self.evictable.popitem()")]
CHECKS = "ch07 and (worked or behaves_like)"
