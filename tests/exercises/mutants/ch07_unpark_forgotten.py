WHAT = "unpark does nothing: a block a request took back stays evictable and can be handed out"
CHAPTER = "07"
EDITS = [("        del self.evictable[block]\n        # END SOLUTION",
          "        pass\n        # END SOLUTION")]
CHECKS = "ch07 and (behaves_like or real_engine)"
