-- mul_div(a, b, c, up): floor(a * b / c), or its ceiling when up, for non-negative integers below
-- 2^53 and c > 0. Exact whenever the result is below 2^53: a product that a double cannot hold is
-- split as a = qa*c + ra, b = qb*c + rb, and ra * rb / c is then divided bit by bit (a rare path,
-- at most 53 steps). Larger results, durations beyond 104 days, are rounded; no decision depends
-- on them. Included where it is used, so that the check script's single-check path creates it
-- only for the algorithms that need it.
local function mul_div(a, b, c, up)
  local p = a * b
  local q, r
  if p < 9007199254740992 then
    r = p % c
    q = (p - r) / c
  else
    local ra = a % c
    local rb = b % c
    q = (a - ra) / c * b + ra * ((b - rb) / c)
    local x, y = ra, rb
    if x > y then x, y = y, x end
    p = x * y
    if p < 9007199254740992 then
      r = p % c
      q = q + (p - r) / c
    else
      -- x * y = n * c + r, built from the top bit of x down; every step stays below 2^54.
      local bit = 1
      while bit * 2 <= x do bit = bit * 2 end
      local n = 0
      r = 0
      while bit >= 1 do
        n, r = n * 2, r * 2
        if r >= c then n, r = n + 1, r - c end
        if x >= bit then
          x = x - bit
          if r >= c - y then n, r = n + 1, r - (c - y) else r = r + y end
        end
        bit = bit / 2
      end
      q = q + n
    end
  end
  if up and r > 0 then q = q + 1 end
  return q
end
