WHAT = "when every proposal is accepted, the target's own token after them is forgotten"
CHAPTER = "08"
EDITS = [("        return list(proposed[:accepted]) + [target[accepted]]",
          "        if accepted == k and k > 0:\n"
          "            return list(proposed)\n"
          "        return list(proposed[:accepted]) + [target[accepted]]")]
CHECKS = "ch08 and (worked or greedy_accept)"
