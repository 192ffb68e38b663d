WHAT = "admits the newest waiting request first"
CHAPTER = "03"
EDITS = [("request = min(self.waiting, key=lambda r: r.arrival_index)",
          "request = max(self.waiting, key=lambda r: r.arrival_index)")]
CHECKS = "ch03 and (seed_example or arrivals)"
