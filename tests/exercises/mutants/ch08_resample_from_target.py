WHAT = "on a rejection, the replacement is drawn from the target's p instead of max(0, p - q)"
CHAPTER = "08"
EDITS = [("        residual = (p[i] - q).clamp(min=0)", "        residual = p[i].clone()")]
CHECKS = "ch08 and sampled_accept"
