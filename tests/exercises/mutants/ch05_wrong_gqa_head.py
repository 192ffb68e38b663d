WHAT = "maps query head h to KV head h % num_kv_heads instead of h // group"
CHAPTER = "05"
EDITS = [("kv_head = head // GROUP", "kv_head = head % (tl.num_programs(1) // GROUP)")]
CHECKS = "ch05 and matches_the_reference"
