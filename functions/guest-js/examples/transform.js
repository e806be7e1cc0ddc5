// TripLines {"type": "navi.trip_finished"}: each record is a line
// `USER DISTANCE_M` (e.g. `u-42 5500`); it becomes one event of `type` with
// {"distance_m": DISTANCE_M}, occurred at the record's timestamp. The
// event's id is the record's place, so a record read twice makes the same
// event.

import { Envelope, Unusable, exportTransform, rfc3339FromMillis } from "laurel";

class TripLines {
  constructor(config) {
    this.type = config.type;
  }

  transform(record) {
    const line = record.text().trim();
    const space = line.indexOf(" ");
    if (space < 0) return new Unusable(`${JSON.stringify(line)} is not \`USER DISTANCE_M\``);
    const [user, distance] = [line.slice(0, space), line.slice(space + 1)];
    if (!/^[0-9]+$/.test(distance)) return new Unusable(`${JSON.stringify(distance)} is not a whole number of metres`);
    if (record.timestampMs === undefined) return new Unusable("the record has no timestamp");
    return [
      new Envelope({
        id: record.eventId(0),
        type: this.type,
        userId: user,
        occurredAt: rfc3339FromMillis(record.timestampMs),
        payload: { distance_m: Number(distance) },
      }),
    ];
  }
}

export const { transforms, transformScope } = exportTransform(TripLines);
