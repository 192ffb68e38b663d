"""A correct but slow build of milestone 4's speculative track: the same proposals, at a full
scan of the context per proposal."""
WHAT = ("prompt lookup collects every earlier match of the suffix, then keeps the most recent one, "
        "instead of stopping at the first match found from the right")
CHAPTER = "08"
EDITS = [("        for start in range(len(tokens) - n - 1, -1, -1):"
          "      # most recent match first\n"
          "            if tokens[start:start + n] == suffix:\n"
          "                return tokens[start + n:start + n + k]\n",
          "        matches = [start for start in range(len(tokens) - n)\n"
          "                   if tokens[start:start + n] == suffix]\n"
          "        if matches:\n"
          "            return tokens[matches[-1] + n:matches[-1] + n + k]\n")]
MILESTONE = 4
