WHAT = "pack_step numbers the new tokens' positions from 0, forgetting the cached ones"
CHAPTER = "01"
EDITS = [("positions = torch.arange(num_cached, seq_len, dtype=torch.int64)",
          "positions = torch.arange(0, num_new, dtype=torch.int64)")]
CHECKS = "ch01 and (worked or pack_step)"
