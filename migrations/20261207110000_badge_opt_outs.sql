-- Users who do not want their progress on public badges (an award's badge
-- is public only if its definition says "public_badge": true). A user not
-- here has not opted out.
CREATE TABLE badge_opt_outs (
    user_id       text COLLATE "C" PRIMARY KEY,
    opted_out_at  timestamptz NOT NULL DEFAULT now()
);
