WHAT = "admits waiting requests even in a step that had to evict"
CHAPTER = "03"
EDITS = [("        if output.preempted:\n            return",
          "        if False:\n            return")]
CHECKS = "ch03 and step_by_step and evictions"
