WHAT = "no threshold: a prompt goes to the replica with any match at all, even a few characters"
CHAPTER = "09"
EDITS = [("        if (match[best] < self.threshold * len(prompt)\n                or ",
          "        if (match[best] == 0\n                or ")]
CHECKS = "ch09 and (by_the_rule or real_replicas)"
