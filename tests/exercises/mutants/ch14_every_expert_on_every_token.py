WHAT = "every expert runs on every token, its output masked to the tokens that chose it"
CHAPTER = "14"
EDITS = [("    for index, pairs in dispatch(ids):\n",
          "    for index in range(w_down.shape[0]):\n        pairs = torch.arange(ids.numel())\n"),
         ("        outputs[pairs] = (out * flat_weights[pairs]).to(x.dtype)\n",
          "        outputs += (out * flat_weights * (ids.reshape(-1, 1) == index)).to(x.dtype)\n")]
CHECKS = "ch14 and untouched_experts"
