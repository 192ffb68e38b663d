WHAT = ("the product builds the float matrix q * scale on every call (right numbers, every "
        "weight rewritten)")
CHAPTER = "12"
EDITS = [("    out = (x @ q.T.float()) * scale\n",
          "    out = x @ (q.float() * scale[:, None]).T\n")]
CHECKS = "ch12 and int8_linear"
