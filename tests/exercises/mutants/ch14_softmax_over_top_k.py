WHAT = "the softmax runs over the top-k logits only (always renormalised)"
CHAPTER = "14"
EDITS = [("    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)\n"
          "    weights, ids = torch.topk(probs, top_k, dim=-1)\n",
          "    logits, ids = torch.topk(router_logits.float(), top_k, dim=-1)\n"
          "    weights = torch.softmax(logits, dim=-1)\n")]
CHECKS = "ch14 and route_matches_minicb"
