WHAT = "the combine sums a token's outputs from the last slot to the first"
CHAPTER = "14"
EDITS = [("    total = outputs[:, 0]\n    for slot in range(1, top_k):\n",
          "    total = outputs[:, top_k - 1]\n    for slot in range(top_k - 2, -1, -1):\n")]
CHECKS = "ch14 and forward_equals_minicb"
