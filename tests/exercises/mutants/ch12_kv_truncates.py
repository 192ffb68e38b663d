WHAT = "the KV row truncates toward zero instead of rounding to nearest"
CHAPTER = "12"
EDITS = [("    q = torch.round(x * (1.0 / scale)).clamp(-127, 127).to(torch.int8)\n",
          "    q = (x * (1.0 / scale)).trunc().clamp(-127, 127).to(torch.int8)\n")]
CHECKS = "ch12 and (kv_rows_match or attention_kernel)"
