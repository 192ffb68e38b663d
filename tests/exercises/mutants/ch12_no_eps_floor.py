WHAT = "no floor on the scale: an all-zero channel divides by zero"
CHAPTER = "12"
EDITS = [("    scale = (w.abs().amax(dim=1) / 127.5).clamp(min=torch.finfo(torch.float32).eps)\n",
          "    scale = w.abs().amax(dim=1) / 127.5\n")]
CHECKS = "ch12 and quantizer_matches_minicb"
