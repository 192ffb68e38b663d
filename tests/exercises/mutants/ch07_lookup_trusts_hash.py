WHAT = "lookup trusts the hash: a collision returns another prefix's KV"
CHAPTER = "07"
EDITS = [("        if entry is None or entry.parent is not parent"
          " or entry.token_ids != token_ids:\n"
          "            return None\n        return entry",
          "        return entry")]
CHECKS = "ch07 and collision"
