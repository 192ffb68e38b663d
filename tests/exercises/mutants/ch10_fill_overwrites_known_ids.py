WHAT = "fill_placeholders replaces every id, known tokens included, by a row of the step before"
CHAPTER = "10"
EDITS = [("    return torch.where(holes, previous[rows], input_ids)",
          "    return previous[rows]")]
CHECKS = "ch10 and (worked or fill_placeholders)"
