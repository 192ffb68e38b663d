"""A correct but slow build of milestone 1: its schedule equals minicb's, at a quadratic cost."""
WHAT = ("looks for an eviction victim before every running request, whether or not it fits: "
        "a scan of the running list per request, every step")
CHAPTER = "03"
EDITS = [("            num_tokens = self.tokens_this_step(request)\n"
          "            if num_tokens == 0:\n",
          "            num_tokens = self.tokens_this_step(request)\n"
          "            victim = self.pick_victim()       # ready in case it does not fit\n"
          "            if num_tokens == 0:\n")]
MILESTONE = 1
