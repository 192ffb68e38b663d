WHAT = "fork shares the partly filled last block but never copies it: samples overwrite each other"
CHAPTER = "04"
EDITS = [("        if num_tokens % self.block_size:\n"
          "            self.copy_before_write[child.request_id] = num_tokens // self.block_size\n",
          "")]
CHECKS = "ch04 and (worked or manager_behaves_like)"
