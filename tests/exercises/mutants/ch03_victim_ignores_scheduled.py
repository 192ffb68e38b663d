WHAT = "pick_victim takes the latest arrival among all running requests, scheduled ones included"
CHAPTER = "03"
EDITS = [("candidates = [r for r in self.running if r.request_id not in self.scheduled_ids]",
          "candidates = list(self.running)")]
CHECKS = "ch03 and victim"
