"""TripLines {"type": "navi.trip_finished"}: each record is a line
`USER DISTANCE_M` (e.g. `u-42 5500`); it becomes one event of `type` with
{"distance_m": DISTANCE_M}, occurred at the record's timestamp. The event's
id is the record's place, so a record read twice makes the same event."""

import json

import laurel


class TripLines:
    def __init__(self, config):
        self.type = config["type"]

    def transform(self, record):
        line = record.text().strip()
        user, _, distance = line.partition(" ")
        if not distance:
            return laurel.Unusable(f"{json.dumps(line)} is not `USER DISTANCE_M`")
        if not distance.isdigit():
            return laurel.Unusable(f"{json.dumps(distance)} is not a whole number of metres")
        if record.timestamp_ms is None:
            return laurel.Unusable("the record has no timestamp")
        return [
            laurel.Envelope(
                id=record.event_id(0),
                type=self.type,
                user_id=user,
                occurred_at=laurel.rfc3339_from_millis(record.timestamp_ms),
                payload={"distance_m": int(distance)},
            )
        ]


laurel.export(TripLines)
