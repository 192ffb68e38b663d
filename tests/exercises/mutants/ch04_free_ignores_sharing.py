WHAT = "free pushes every block of the request back, even those another request still holds"
CHAPTER = "04"
EDITS = [("            if self.allocator.release(block):\n"
          "                self.allocator.push_free(block)",
          "            self.allocator.release(block)\n"
          "            self.allocator.push_free(block)")]
CHECKS = "ch04 and (worked or manager_behaves_like)"
