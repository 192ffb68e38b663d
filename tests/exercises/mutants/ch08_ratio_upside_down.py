WHAT = "accepts with probability min(1, q/p) instead of min(1, p/q)"
CHAPTER = "08"
EDITS = [("        ratio = float(p[i, token] / q[token]) if q[token] > 0 else 0.0",
          "        ratio = float(q[token] / p[i, token]) if p[i, token] > 0 else 0.0")]
CHECKS = "ch08 and sampled_accept"
