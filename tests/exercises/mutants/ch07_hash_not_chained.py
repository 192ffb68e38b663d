WHAT = "the block hash ignores the parent: the same tokens after other tokens get the same name"
CHAPTER = "07"
EDITS = [("    return hash((parent_hash, token_ids))", "    return hash(token_ids)")]
CHECKS = "ch07 and (worked or behaves_like)"
