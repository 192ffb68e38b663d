WHAT = "the scale is max|W| / 127 instead of torchao's max|W| / 127.5"
CHAPTER = "12"
EDITS = [("scale = (w.abs().amax(dim=1) / 127.5)", "scale = (w.abs().amax(dim=1) / 127.0)")]
CHECKS = "ch12 and quantizer_matches_minicb"
