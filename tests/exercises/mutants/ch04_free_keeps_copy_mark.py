WHAT = "the copy mark stays after the copy: every later allocate copies the block again"
CHAPTER = "04"
EDITS = [("        index = self.block_to_copy(request)\n"
          "        self.copy_before_write.pop(request.request_id, None)\n",
          "        index = self.block_to_copy(request)\n")]
CHECKS = "ch04 and (worked or manager_behaves_like)"
