export const digitSum = (n) => {
  if (n < 0) {
    throw new Error('negative number');
  }
  let sum = 0;
  for (let rest = n; rest > 0; rest = Math.floor(rest / 10)) {
    sum += rest % 10;
  }
  return sum;
};
