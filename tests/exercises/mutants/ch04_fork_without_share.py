WHAT = "fork copies the parent's table but takes no reference to its blocks"
CHAPTER = "04"
EDITS = [("        for block in shared:\n            self.allocator.share(block)\n", "")]
CHECKS = "ch04 and (worked or manager_behaves_like)"
