WHAT = "one scale for the whole matrix instead of one per output channel"
CHAPTER = "12"
EDITS = [("scale = (w.abs().amax(dim=1) / 127.5)",
          "scale = (w.abs().amax().expand(w.shape[0]) / 127.5)")]
CHECKS = "ch12 and quantizer_matches_minicb"
