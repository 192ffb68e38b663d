WHAT = "the router never renormalises the top-k weights"
CHAPTER = "14"
EDITS = [("    if renormalize:\n        weights = weights / weights.sum(dim=-1, keepdim=True)\n",
          "")]
CHECKS = "ch14 and route_matches_minicb"
