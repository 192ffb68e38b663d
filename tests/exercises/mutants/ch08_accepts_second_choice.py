WHAT = ("greedy acceptance also keeps a proposal that is the target's second choice: longer "
        "accepted runs (a speedup) that change what the model says")
CHAPTER = "08"
EDITS = [("        while accepted < k and proposed[accepted] == target[accepted]:\n",
          "        second = logits.topk(2, dim=-1).indices[:, 1].tolist()\n"
          "        while accepted < k and proposed[accepted] in (target[accepted], "
          "second[accepted]):\n")]
CHECKS = "ch08 and (worked or greedy_accept)"
